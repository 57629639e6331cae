//! Standard output and the user's interrupts, the way command-line tools treat them.
//!
//! Output: every line goes through [`line`] (the crate's `println!` is this), so a reader that goes away
//! (`weightlift probe | head -1`) ends the program quietly with status 0, as ripgrep and coreutils do, instead of
//! a panic. Interrupts: a command that writes a file removes its temporary file on SIGINT or SIGTERM and says so.

use std::io::Write;

/// Writes one formatted line to stdout (flushed, so a closed reader is noticed here and not at exit).
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()) {
        closed(&e);
    }
}

fn closed(e: &std::io::Error) -> ! {
    // Nothing is left to say to a reader that has gone: the work is done, the output unwanted. Nothing half-written
    // stays behind either.
    weightlift::format::output::remove_pending();
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("weightlift: error: writing to standard output: {e}");
    std::process::exit(2);
}

/// For the rest of a command that writes a file: SIGINT or SIGTERM removes the temporary files of the writes in
/// progress, says so on stderr and exits with 128 + the signal, as a load does on Ctrl-C. The target keeps its
/// old contents (or stays absent).
pub fn remove_partial_output_on_interrupt(what: &'static str) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new().name("weightlift-interrupt".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let removed = weightlift::format::output::remove_pending();
            let names: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
            let gone = if names.is_empty() { String::new() } else { format!(" (removed {})", names.join(", ")) };
            eprintln!("weightlift: interrupted: {what} stopped, nothing written{gone}");
            std::process::exit(128 + signal);
        }
    })?;
    Ok(())
}
