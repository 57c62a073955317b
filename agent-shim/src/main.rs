//! `tollgate-shim`: started by the supervisor as a sandbox's pid 1 (no arguments; the plan
//! comes on fd 3), as the supervisor's spawner of those (`tollgate-shim spawner`, internal),
//! and, inside a sandbox, the agent's gateway client (`tollgate-shim tool`,
//! `tollgate-shim child` for delegation, `tollgate-shim receipt` for its own powers).
#![forbid(unsafe_code)]

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => tollgate_agent_shim::run(),
        // Internal: the supervisor's gateway runs `exec` commands in a sandbox with it.
        Some("enter") => tollgate_agent_shim::enter(),
        // Internal: the supervisor starts every shim and `exec` helper through it.
        Some("spawner") => std::process::exit(tollgate_agent_shim::spawner::main(
            tollgate_agent_shim::spawner::Entries {
                shim: tollgate_agent_shim::run,
                enter: tollgate_agent_shim::enter,
            },
        )),
        // Internal: pid 1 starts the sandbox's model endpoint with it.
        Some("models") => std::process::exit(tollgate_agent_shim::models::main(&args[1..])),
        // Internal: pid 1 starts the sandbox's egress proxy with it.
        Some("egress") => std::process::exit(tollgate_agent_shim::egress::main(&args[1..])),
        Some("tool") => std::process::exit(tollgate_agent_shim::tool::main(&args[1..])),
        Some("child") => std::process::exit(tollgate_agent_shim::child::main(&args[1..])),
        Some("receipt") => std::process::exit(tollgate_agent_shim::powers::main(&args[1..])),
        // For `tollgate doctor`: what this kernel offers the confinement.
        Some("probe") => std::process::exit(tollgate_agent_shim::probe::main()),
        Some(_) => {
            eprintln!(
                "tollgate-shim is started by tollgate-supervisor (no arguments); inside a \
                 sandbox use `tollgate-shim tool read|write|list|stat|delete|exec ...`, \
                 `tollgate-shim child delegate|start|list|watch|stop ...` or \
                 `tollgate-shim receipt [--json]` (what this run may do, and has left)"
            );
            std::process::exit(2);
        }
    }
}
