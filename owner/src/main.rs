//! `owner`: one data owner of private distributed PCA (`dpca_owner::cli`).

fn main() -> anyhow::Result<()> {
    dpca_owner::cli::main(std::env::args_os().collect())
}
