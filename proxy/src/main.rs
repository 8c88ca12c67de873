//! `proxy`: the aggregation server of private distributed PCA (`dpca_proxy::cli`).

fn main() -> anyhow::Result<()> {
    dpca_proxy::cli::main(std::env::args_os().collect())
}
