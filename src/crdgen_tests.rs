use super::*;

#[test]
fn committed_crds_match_the_api_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for folder in ["crds", "charts/vramfit/crds"] {
        for (name, yaml) in crd_manifests().expect("CRDs serialise") {
            let committed =
                std::fs::read_to_string(root.join(folder).join(name)).unwrap_or_default();
            assert!(
                committed.ends_with(&yaml),
                "{folder}/{name} is stale: run `cargo run -- crdgen` and commit it"
            );
        }
    }
}
