//! `tollgate-shim`: started by the supervisor, never by hand; see the library docs.

fn main() {
    if std::env::args().len() > 1 {
        eprintln!(
            "tollgate-shim builds a sandbox from the plan on fd 3 and is started by \
             tollgate-supervisor; it takes no arguments yet"
        );
        std::process::exit(2);
    }
    tollgate_agent_shim::run()
}
