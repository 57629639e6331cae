//! How many GETs a load keeps in flight. An object read costs the CPU little; what bounds it is the network: each
//! GET of a cloud bucket gets ~90 MB/s after 20-80 ms, so the rate a client reaches is about GETs in flight × range
//! / (first byte + range / per-GET rate), up to its link or the server's limit. The right count depends on the
//! bucket and the link, so by default it is found while the load runs, as TCP finds its window:
//!
//! - **slow start**: from [`START`] GETs, the count doubles after each round (a round ends once as many GETs as
//!   the count have finished since it began) while the round's rate rose by at least [`RISE`] over the last;
//! - **hold**: once a round's rate did not rise, or a few of its answers (at most [`SLOWDOWN_SHARE`]) asked to slow
//!   down, the count stays (a plateau: the link, the server or the CPU is the bound, and more GETs would only hold
//!   more memory; the few answers are retried);
//! - **back off**: a round in which more of the server's answers than that were 503 or 429 (S3's SlowDown) halves
//!   the count, and from then on it grows by one GET per round only (the server said where its limit is);
//! - always within `max`: the staging memory a GET in flight holds ([`crate::load`] sizes it) bounds the count.
//!
//! It starts at 128 rather than at a handful: a load of a few GB from a bucket that gives each GET ~90 MB/s lasts a
//! few rounds of ~0.2 s, and each round spent below the link's rate is a sizeable part of it (starting at 64, a
//! 4.2 GiB load onto an H100 spent one of its three rounds at half the count: 0.69 of curl's 128 GETs).
//!
//! A fixed count (the `remote_concurrency` setting) turns all of this off.

use std::time::{Duration, Instant};

/// GETs in flight at the start of a load (at most the bound).
pub const START: usize = 128;
/// The share of a round's answers that may ask to slow down (503, 429) before the count is halved.
pub const SLOWDOWN_SHARE: f64 = 0.05;
/// A round's rate must exceed the last one's by this factor for the count to keep doubling.
pub const RISE: f64 = 1.10;
/// Shortest round: a load of a fast local server finishes GETs in microseconds, and a rate needs some time.
const MIN_ROUND: Duration = Duration::from_millis(50);
/// Rounds kept for the report.
const KEPT: usize = 24;

/// The phase the count is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A fixed count (a setting).
    Fixed,
    /// Doubling while the rate rises.
    SlowStart,
    /// The rate stopped rising: the count stays.
    Plateau,
    /// The server asked to slow down: halved, then growing by one per round.
    BackedOff,
}

impl Phase {
    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Fixed => "fixed",
            Phase::SlowStart => "slow start",
            Phase::Plateau => "plateau",
            Phase::BackedOff => "backed off",
        }
    }
}

/// One round of a load's GETs, for the report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Round {
    /// Seconds from the first GET to the round's end.
    pub at_secs: f64,
    /// The count in effect during the round.
    pub target: usize,
    /// Bytes a second that landed during the round.
    pub rate: f64,
    /// 503 and 429 answers during the round.
    pub throttled: u64,
}

/// The count of GETs in flight, and what it was.
#[derive(Clone, Debug)]
pub struct Pacer {
    target: usize,
    max: usize,
    phase: Phase,
    started: Option<Instant>,
    round_start: Option<Instant>,
    round_bytes: u64,
    round_finished: usize,
    last_rate: f64,
    throttled_seen: u64,
    throttled_total: u64,
    peak_target: usize,
    peak_in_flight: usize,
    rounds: Vec<Round>,
    why_max: String,
}

impl Pacer {
    /// A count found at run time, never above `max` (`why_max` says what bounds it, for the report).
    pub fn adaptive(max: usize, why_max: String) -> Pacer {
        let max = max.max(1);
        Pacer::new(START.min(max), max, Phase::SlowStart, why_max)
    }

    /// A fixed count of `n` (at most `max`).
    pub fn fixed(n: usize, max: usize, why_max: String) -> Pacer {
        let max = max.max(1);
        Pacer::new(n.clamp(1, max), max, Phase::Fixed, why_max)
    }

    fn new(target: usize, max: usize, phase: Phase, why_max: String) -> Pacer {
        Pacer {
            target,
            max,
            phase,
            started: None,
            round_start: None,
            round_bytes: 0,
            round_finished: 0,
            last_rate: 0.0,
            throttled_seen: 0,
            throttled_total: 0,
            peak_target: target,
            peak_in_flight: 0,
            rounds: Vec::new(),
            why_max,
        }
    }

    /// GETs to keep in flight now.
    pub fn target(&self) -> usize {
        self.target
    }

    /// A GET was opened; `in_flight` counts it.
    pub fn opened(&mut self, now: Instant, in_flight: usize) {
        self.started.get_or_insert(now);
        self.round_start.get_or_insert(now);
        self.peak_in_flight = self.peak_in_flight.max(in_flight);
    }

    /// `bytes` landed; `finished` GETs ended with them; `throttled` is the count of 503/429 answers the load's
    /// servers gave so far (a running total). Ends the round when it is due and sets the next count.
    pub fn landed(&mut self, now: Instant, bytes: u64, finished: usize, throttled: u64) {
        self.round_bytes += bytes;
        self.round_finished += finished;
        let Some(start) = self.round_start else { return };
        let elapsed = now.saturating_duration_since(start);
        if self.round_finished < self.target || elapsed < MIN_ROUND {
            return;
        }
        let rate = self.round_bytes as f64 / elapsed.as_secs_f64();
        let new_throttles = throttled.saturating_sub(self.throttled_seen);
        self.throttled_seen = throttled;
        self.throttled_total += new_throttles;
        if self.rounds.len() < KEPT {
            let at_secs = self.started.map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64());
            self.rounds.push(Round { at_secs, target: self.target, rate, throttled: new_throttles });
        }
        if self.phase != Phase::Fixed {
            let share = new_throttles as f64 / (self.round_finished as u64 + new_throttles).max(1) as f64;
            self.next_target(rate, new_throttles, share);
        }
        self.last_rate = rate;
        self.round_start = Some(now);
        self.round_bytes = 0;
        self.round_finished = 0;
    }

    fn next_target(&mut self, rate: f64, throttles: u64, share: f64) {
        if share > SLOWDOWN_SHARE {
            self.phase = Phase::BackedOff;
            self.target = (self.target / 2).max(1);
            return;
        }
        if throttles > 0 {
            if self.phase == Phase::SlowStart {
                self.phase = Phase::Plateau;
            }
            return;
        }
        match self.phase {
            Phase::SlowStart if rate >= self.last_rate * RISE => self.target = (self.target * 2).min(self.max),
            Phase::SlowStart => self.phase = Phase::Plateau,
            Phase::BackedOff => self.target = (self.target + 1).min(self.max),
            Phase::Plateau | Phase::Fixed => {}
        }
        self.peak_target = self.peak_target.max(self.target);
    }

    /// What the pacer did, for the report.
    pub fn summary(&self, setting: &str) -> GetsReport {
        GetsReport {
            setting: setting.to_string(),
            phase: self.phase,
            start: self.rounds.first().map_or(self.target, |r| r.target),
            last: self.target,
            peak_target: self.peak_target,
            peak_in_flight: self.peak_in_flight,
            max: self.max,
            why_max: self.why_max.clone(),
            throttled: self.throttled_total,
            rounds: self.rounds.clone(),
        }
    }
}

/// How many GETs a load kept in flight and why (part of the I/O report of a load of objects).
#[derive(Clone, Debug)]
pub struct GetsReport {
    /// The `remote_concurrency` setting as given (`auto` or a count).
    pub setting: String,
    /// Where the count ended.
    pub phase: Phase,
    /// The count at the start.
    pub start: usize,
    /// The count at the end.
    pub last: usize,
    /// The highest count.
    pub peak_target: usize,
    /// The most GETs that were in flight at once.
    pub peak_in_flight: usize,
    /// The bound on the count.
    pub max: usize,
    /// What sets the bound.
    pub why_max: String,
    /// 503 and 429 answers during the load.
    pub throttled: u64,
    /// The rounds, as measured (the first few).
    pub rounds: Vec<Round>,
}

impl GetsReport {
    /// One sentence: the count and why.
    pub fn why(&self) -> String {
        let how = match self.phase {
            Phase::SlowStart if self.rounds.is_empty() => {
                format!("{} GETs in flight: the load ended before a round of them had finished", self.last)
            }
            Phase::Fixed => format!("{} GETs in flight (remote_concurrency={})", self.last, self.setting),
            Phase::SlowStart => format!(
                "{} GETs in flight: doubled from {} while the rate rose, up to the bound",
                self.last, self.start
            ),
            Phase::Plateau => format!(
                "{} GETs in flight: doubled from {} until the rate stopped rising by {:.0} % a round",
                self.last,
                self.start,
                (RISE - 1.0) * 100.0
            ),
            Phase::BackedOff => format!(
                "{} GETs in flight: the server answered {} times 503/429 (slow down), more than {:.0} % of a round, \
                 so the count was halved, then grown by one a round",
                self.last,
                self.throttled,
                SLOWDOWN_SHARE * 100.0
            ),
        };
        format!("{how}; at most {} ({})", self.max, self.why_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs rounds of a server whose rate is `rate(gets)`, with `throttle(gets)` answers a round; the counts of the
    /// first `n` rounds.
    fn run(mut p: Pacer, n: usize, rate: impl Fn(usize) -> f64, throttle: impl Fn(usize) -> u64) -> Vec<usize> {
        let t0 = Instant::now();
        let mut now = t0;
        let mut throttled = 0;
        let mut counts = Vec::new();
        p.opened(now, 1);
        for _ in 0..n {
            let target = p.target();
            counts.push(target);
            now += Duration::from_millis(200);
            throttled += throttle(target);
            p.landed(now, (rate(target) * 0.2) as u64, target, throttled);
        }
        counts
    }

    #[test]
    fn doubles_while_the_rate_rises_and_holds_at_the_plateau() {
        // 70 MB/s a GET up to a 12 GB/s link: 128 GETs give 8.96 GB/s, 256 the link.
        let counts = run(Pacer::adaptive(1024, "staging".into()), 6, |g| (g as f64 * 70e6).min(12e9), |_| 0);
        assert_eq!(counts, [128, 256, 512, 512, 512, 512]);
    }

    #[test]
    fn stops_at_the_bound() {
        let counts = run(Pacer::adaptive(200, "staging".into()), 4, |g| g as f64 * 70e6, |_| 0);
        assert_eq!(counts, [128, 200, 200, 200]);
        assert_eq!(run(Pacer::adaptive(8, String::new()), 2, |g| g as f64, |_| 0), [8, 8]);
    }

    #[test]
    fn halves_when_many_answers_slow_down_then_grows_by_one() {
        // Above 200 GETs, a tenth of the answers are 503 SlowDown.
        let counts = run(
            Pacer::adaptive(512, "staging".into()),
            8,
            |g| g as f64 * 70e6,
            |g| (g / 10 * usize::from(g > 200)) as u64,
        );
        assert_eq!(counts, [128, 256, 128, 129, 130, 131, 132, 133]);
    }

    #[test]
    fn a_few_slowdowns_stop_the_growth_only() {
        // One 503 among 256 answers: retried, and the count stays.
        let counts = run(Pacer::adaptive(1024, "staging".into()), 5, |g| g as f64 * 70e6, |g| u64::from(g >= 256));
        assert_eq!(counts, [128, 256, 256, 256, 256]);
    }

    #[test]
    fn a_fixed_count_stays() {
        let counts = run(Pacer::fixed(8, 128, "staging".into()), 4, |g| g as f64 * 70e6, |_| 1);
        assert_eq!(counts, [8, 8, 8, 8]);
        assert_eq!(run(Pacer::fixed(500, 128, String::new()), 1, |_| 1.0, |_| 0), [128]);
    }

    #[test]
    fn a_round_lasts_until_as_many_gets_as_the_count_finished() {
        let mut p = Pacer::adaptive(256, String::new());
        let t0 = Instant::now();
        p.opened(t0, 1);
        p.landed(t0 + Duration::from_secs(1), 1 << 30, 127, 0);
        assert_eq!(p.target(), 128, "127 of 128 finished: the round goes on");
        p.landed(t0 + Duration::from_secs(1), 0, 1, 0);
        assert_eq!(p.target(), 256);
        let s = p.summary("auto");
        assert_eq!((s.start, s.last, s.rounds.len()), (128, 256, 1));
        assert!(s.why().contains("at most 256"), "{}", s.why());
    }
}
