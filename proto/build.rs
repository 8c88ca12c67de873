//! Generates the tonic/prost code with the protoc shipped in the
//! `protoc-bin-vendored` crate, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    // `proxy status --json` prints the status messages as they are.
    let mut config = tonic_prost_build::configure();
    for message in ["ProxyStatus", "StudySummary", "OwnerBudgetSummary"] {
        config =
            config.type_attribute(format!(".dpca.v1.{message}"), "#[derive(serde::Serialize)]");
    }
    config.compile_protos(&["proto/dpca.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/dpca.proto");
    Ok(())
}
