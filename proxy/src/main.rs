//! `proxy`: the aggregation server of private distributed PCA (`dpca_proxy::cli`).

fn main() -> std::process::ExitCode {
    dpca_shell::text::exit(dpca_proxy::cli::main(std::env::args_os().collect()))
}
