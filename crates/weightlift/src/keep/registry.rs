//! What the keeper holds, within its budget: one entry per file identity, loading or ready, each with the leases
//! (handouts) not yet given back. The least recently used entry without leases goes first when room is needed; an
//! entry whose file changed is never served again and goes as soon as its last lease ends. No CUDA here: the
//! memory is a type parameter, so the rules are tested on the CPU.

use std::collections::HashMap;
use std::sync::Arc;

use super::stamp::Key;
use super::wire::EntryStatus;

/// An entry's state.
#[derive(Debug)]
pub enum State<M> {
    /// Being read; its bytes are reserved in the budget.
    Loading,
    /// Ready to serve.
    Ready(Arc<M>),
}

/// One kept file.
#[derive(Debug)]
pub struct Entry<M> {
    /// Loading or ready.
    pub state: State<M>,
    /// Memory it takes, in bytes.
    pub bytes: u64,
    /// Handouts not given back.
    pub leases: u32,
    /// When it was last asked for (a counter).
    pub last_used: u64,
    /// The file changed: never served again, freed when its leases end.
    pub stale: bool,
    /// The path it was first asked for by (for status).
    pub path: String,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Found<M> {
    /// Kept and ready.
    Ready(Arc<M>),
    /// Being loaded.
    Loading,
    /// Not kept; `changed` when an entry of the same file with other contents was (it is now stale or gone).
    Absent {
        /// A former version of the file was kept.
        changed: bool,
    },
}

/// Why [`Registry::begin`] made no room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// An entry of that stamp is held already (loading, or stale with leases).
    Held,
    /// It does not fit the budget, even with every evictable entry gone (why, in a sentence).
    OverBudget(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Held => f.write_str("an entry of this file is held already"),
            Refused::OverBudget(why) => f.write_str(why),
        }
    }
}

/// The entries and the budget.
#[derive(Debug)]
pub struct Registry<M> {
    budget: u64,
    used: u64,
    tick: u64,
    entries: HashMap<Key, Entry<M>>,
}

impl<M> Registry<M> {
    /// An empty registry allowed `budget` bytes.
    pub fn new(budget: u64) -> Registry<M> {
        Registry { budget, used: 0, tick: 0, entries: HashMap::new() }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes the entries take (loading, ready and stale).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Entries held (stale ones included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries being loaded.
    pub fn loading(&self) -> usize {
        self.entries.values().filter(|e| matches!(e.state, State::Loading)).count()
    }

    /// Whether nothing is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `stamp`, if held.
    #[cfg(test)]
    pub fn get(&self, stamp: &Key) -> Option<&Entry<M>> {
        self.entries.get(stamp)
    }

    /// Looks `stamp` up (a ready entry counts as used now). Entries of the same file with other contents become
    /// stale: removed if unleased, else kept only until their leases end.
    pub fn find(&mut self, stamp: &Key) -> Found<M> {
        self.tick += 1;
        let stale: Vec<Key> = self.entries.keys().filter(|k| k.same_source(stamp) && *k != stamp).cloned().collect();
        let changed = !stale.is_empty();
        for k in stale {
            self.retire(&k);
        }
        match self.entries.get_mut(stamp) {
            Some(e) if !e.stale => {
                e.last_used = self.tick;
                match &e.state {
                    State::Ready(m) => Found::Ready(m.clone()),
                    State::Loading => Found::Loading,
                }
            }
            _ => Found::Absent { changed },
        }
    }

    /// Marks an entry stale, removing it at once if nothing leases it.
    fn retire(&mut self, stamp: &Key) {
        let Some(e) = self.entries.get_mut(stamp) else { return };
        e.stale = true;
        if e.leases == 0 && matches!(e.state, State::Ready(_)) {
            self.remove(stamp);
        }
    }

    fn remove(&mut self, stamp: &Key) -> Option<Entry<M>> {
        let e = self.entries.remove(stamp)?;
        self.used -= e.bytes;
        Some(e)
    }

    /// Retires every ready entry whose memory `dead` says is of a file gone (its last name removed, say): never
    /// served again, and freed now unless leased. Returns the memory freed, for the caller to drop.
    pub fn retire_where(&mut self, dead: impl Fn(&M) -> bool) -> Vec<Arc<M>> {
        let gone: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.stale && matches!(&e.state, State::Ready(m) if dead(m)))
            .map(|(k, _)| k.clone())
            .collect();
        let mut freed = Vec::new();
        for k in gone {
            if let Some(e) = self.entries.get_mut(&k) {
                e.stale = true;
                if e.leases == 0
                    && let Some(Entry { state: State::Ready(m), .. }) = self.remove(&k)
                {
                    freed.push(m);
                }
            }
        }
        freed
    }

    /// Reserves `bytes` for a new entry of `stamp`, now loading, evicting least recently used unleased ready
    /// entries as needed; what it evicted is returned (for the caller to drop outside its lock). Refused, evicting
    /// nothing, when even every evictable entry would not make room, or when `stamp` is held already.
    pub fn begin(&mut self, stamp: Key, bytes: u64, path: String) -> Result<Vec<Arc<M>>, Refused> {
        if self.entries.contains_key(&stamp) {
            return Err(Refused::Held);
        }
        let pinned: u64 =
            self.entries.values().filter(|e| e.leases > 0 || matches!(e.state, State::Loading)).map(|e| e.bytes).sum();
        if pinned.saturating_add(bytes) > self.budget {
            return Err(Refused::OverBudget(format!(
                "{bytes} bytes do not fit the keeper's budget of {} bytes ({pinned} held by loads in progress and handouts)",
                self.budget
            )));
        }
        let mut evicted = Vec::new();
        while self.used + bytes > self.budget {
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| e.leases == 0 && matches!(e.state, State::Ready(_)))
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            let Some(k) = victim else { break };
            if let Some(Entry { state: State::Ready(m), .. }) = self.remove(&k) {
                evicted.push(m);
            }
        }
        debug_assert!(self.used + bytes <= self.budget);
        self.tick += 1;
        self.used += bytes;
        self.entries
            .insert(stamp, Entry { state: State::Loading, bytes, leases: 0, last_used: self.tick, stale: false, path });
        Ok(evicted)
    }

    /// Ends the load of `stamp`: ready with `memory`, or removed (its bytes returned to the budget) on `None`. An
    /// entry made stale while it loaded is removed too. Returns the memory not kept, for the caller to drop.
    pub fn finish(&mut self, stamp: &Key, memory: Option<Arc<M>>) -> Option<Arc<M>> {
        let keep = match self.entries.get_mut(stamp) {
            Some(e) if !e.stale && matches!(e.state, State::Loading) => e,
            Some(e) if matches!(e.state, State::Loading) => {
                let _ = e;
                self.remove(stamp);
                return memory;
            }
            _ => return memory,
        };
        match memory {
            Some(m) => {
                keep.state = State::Ready(m);
                None
            }
            None => {
                self.remove(stamp);
                None
            }
        }
    }

    /// A handout of the ready entry `stamp` begins.
    pub fn lease(&mut self, stamp: &Key) {
        if let Some(e) = self.entries.get_mut(stamp) {
            e.leases += 1;
        }
    }

    /// A handout of `stamp` ended; a stale entry whose last lease this was is removed and its memory returned.
    pub fn release(&mut self, stamp: &Key) -> Option<Arc<M>> {
        let e = self.entries.get_mut(stamp)?;
        e.leases = e.leases.saturating_sub(1);
        if e.leases == 0
            && e.stale
            && let Some(Entry { state: State::Ready(m), .. }) = self.remove(stamp)
        {
            return Some(m);
        }
        None
    }

    /// Every entry's status, most recently used first.
    pub fn status(&self) -> Vec<EntryStatus> {
        let mut v: Vec<(&Key, &Entry<M>)> = self.entries.iter().collect();
        v.sort_by_key(|(_, e)| std::cmp::Reverse(e.last_used));
        v.into_iter()
            .map(|(k, e)| EntryStatus {
                path: e.path.clone(),
                len: k.len(),
                bytes: e.bytes,
                state: if e.stale {
                    "stale".into()
                } else {
                    match e.state {
                        State::Loading => "loading".into(),
                        State::Ready(_) => "ready".into(),
                    }
                },
                leases: e.leases,
            })
            .collect()
    }

    /// Removes every entry, returning the memory of the ready ones.
    pub fn clear(&mut self) -> Vec<Arc<M>> {
        self.used = 0;
        self.entries
            .drain()
            .filter_map(|(_, e)| match e.state {
                State::Ready(m) => Some(m),
                State::Loading => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keep::stamp::Stamp;
    use proptest::prelude::*;

    fn stamp(ino: u64, version: i64) -> Key {
        Key::File(Stamp { dev: 1, ino, len: 100, mtime_ns: version, ctime_ns: version })
    }

    #[test]
    fn a_changed_file_is_never_found_and_its_leased_entry_goes_with_its_last_lease() {
        let mut r: Registry<u32> = Registry::new(1000);
        let old = stamp(7, 1);
        r.begin(old.clone(), 100, "a".into()).unwrap();
        assert!(r.finish(&old, Some(Arc::new(1))).is_none());
        assert!(matches!(r.find(&old), Found::Ready(_)));
        r.lease(&old);
        let new = stamp(7, 2);
        assert!(matches!(r.find(&new), Found::Absent { changed: true }));
        assert!(matches!(r.find(&old), Found::Absent { .. }), "a stale entry is not served");
        assert_eq!(r.used(), 100, "a leased stale entry still counts");
        assert_eq!(r.release(&old).map(|m| *m), Some(1));
        assert_eq!(r.used(), 0);
        assert!(r.is_empty());
    }

    #[test]
    fn room_is_made_from_the_least_recently_used_unleased_entry() {
        let mut r: Registry<u64> = Registry::new(300);
        for i in 0..3 {
            r.begin(stamp(i, 0), 100, format!("{i}")).unwrap();
            r.finish(&stamp(i, 0), Some(Arc::new(i)));
        }
        r.find(&stamp(0, 0)); // 1 is now the oldest
        r.lease(&stamp(1, 0)); // but leased, so 2 goes
        let evicted = r.begin(stamp(9, 0), 100, "9".into()).unwrap();
        assert_eq!(evicted.iter().map(|m| **m).collect::<Vec<_>>(), vec![2]);
        let err = r.begin(stamp(10, 0), 250, "10".into()).unwrap_err();
        assert!(err.to_string().contains("budget"), "{err}");
        assert_eq!(r.len(), 3, "a refused reservation evicts nothing");
    }

    #[derive(Clone, Debug)]
    enum Step {
        Find(u64, i64),
        Begin(u64, i64, u64),
        Finish(u64, i64, bool),
        Lease(u64, i64),
        Release(u64, i64),
    }

    fn step() -> impl Strategy<Value = Step> {
        let f = 0u64..6;
        let v = 0i64..3;
        prop_oneof![
            (f.clone(), v.clone()).prop_map(|(a, b)| Step::Find(a, b)),
            (f.clone(), v.clone(), 1u64..400).prop_map(|(a, b, n)| Step::Begin(a, b, n)),
            (f.clone(), v.clone(), any::<bool>()).prop_map(|(a, b, ok)| Step::Finish(a, b, ok)),
            (f.clone(), v.clone()).prop_map(|(a, b)| Step::Lease(a, b)),
            (f, v).prop_map(|(a, b)| Step::Release(a, b)),
        ]
    }

    /// Memory that counts its drops.
    #[derive(Debug)]
    struct Tracked(u64, i64, Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    proptest! {
        // Over 1,000 mixed steps: the budget holds, the books balance, every memory made is freed exactly once by
        // the end (none leaks), and a leased entry is never evicted to make room.
        #[test]
        fn the_budget_holds_and_every_memory_is_freed_once(steps in proptest::collection::vec(step(), 1000)) {
            let freed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut r: Registry<Tracked> = Registry::new(1000);
            let mut made = 0usize;
            let mut leases: HashMap<Key, u32> = HashMap::new();
            for s in steps {
                match s {
                    Step::Find(i, v) => { r.find(&stamp(i, v)); }
                    Step::Begin(i, v, n) => {
                        if let Ok(evicted) = r.begin(stamp(i, v), n, String::new()) {
                            for m in &evicted {
                                prop_assert_eq!(leases.get(&stamp(m.0, m.1)).copied().unwrap_or(0), 0);
                            }
                        }
                    }
                    Step::Finish(i, v, ok) => {
                        let loading = matches!(r.get(&stamp(i, v)).map(|e| &e.state), Some(State::Loading));
                        if loading {
                            let m = ok.then(|| Arc::new(Tracked(i, v, freed.clone())));
                            if ok { made += 1; }
                            r.finish(&stamp(i, v), m);
                        }
                    }
                    Step::Lease(i, v) => {
                        if let Found::Ready(_) = r.find(&stamp(i, v)) {
                            r.lease(&stamp(i, v));
                            *leases.entry(stamp(i, v)).or_default() += 1;
                        }
                    }
                    Step::Release(i, v) => {
                        let k = stamp(i, v);
                        if leases.get(&k).copied().unwrap_or(0) > 0 {
                            *leases.get_mut(&k).unwrap() -= 1;
                            r.release(&k);
                        }
                    }
                }
                prop_assert!(r.used() <= r.budget());
                let sum: u64 = r.entries.values().map(|e| e.bytes).sum();
                prop_assert_eq!(sum, r.used());
                for (k, e) in &r.entries {
                    prop_assert_eq!(e.leases, leases.get(k).copied().unwrap_or(0));
                }
                let held = r.entries.values().filter(|e| matches!(e.state, State::Ready(_))).count();
                prop_assert_eq!(made - freed.load(std::sync::atomic::Ordering::SeqCst), held);
            }
            drop(r.clear());
            prop_assert_eq!(made, freed.load(std::sync::atomic::Ordering::SeqCst));
            prop_assert_eq!(r.used(), 0);
        }
    }
}
