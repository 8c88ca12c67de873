//! `owner`: one data owner of private distributed PCA (`dpca_owner::cli`).

fn main() -> std::process::ExitCode {
    dpca_shell::text::exit(dpca_owner::cli::main(std::env::args_os().collect()))
}
