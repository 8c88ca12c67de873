//! Generates the tonic/prost code with the protoc shipped in the
//! `protoc-bin-vendored` crate, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure().compile_protos(&["proto/dpca.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/dpca.proto");
    Ok(())
}
