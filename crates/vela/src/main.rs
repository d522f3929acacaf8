//! The `vela` binary: command line, configuration and the wiring of the crates
//! into processes (`standalone`, `bookie`, `broker`, `admin`, `perf`).

fn main() {
    eprintln!("vela: no commands yet");
    std::process::exit(2);
}
