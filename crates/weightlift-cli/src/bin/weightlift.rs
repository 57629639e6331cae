//! The `weightlift` command (see the library's `run`).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(weightlift_cli::run(std::env::args_os()))
}
