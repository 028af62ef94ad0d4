//! `switchyard-agent`: the agent binary (placeholder until the agent work lands).

fn main() {
    eprintln!("switchyard-agent: not implemented yet");
    std::process::exit(2);
}
