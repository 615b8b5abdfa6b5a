use super::*;

fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn settings_come_from_the_environment() {
    let s = Settings::from_vars(vars(&[
        ("VRAMFIT_ALLOC_POLICY", "vramfit"),
        ("VRAMFIT_BUDGET_BYTES", "4294967296"),
        ("VRAMFIT_STATS_DIR", "/run/vramfit"),
    ]))
    .unwrap();
    assert_eq!(s.policy, Policy::Vramfit);
    assert_eq!(s.budget, Some(4 << 30));
    assert_eq!(s.stats_dir, Some(PathBuf::from("/run/vramfit")));
    let defaults = Settings::from_vars(vars(&[("VRAMFIT_BUDGET_BYTES", "0")])).unwrap();
    assert_eq!(defaults.policy, Policy::Pytorch);
    assert_eq!(defaults.budget, None);
    assert_eq!(defaults.stats_dir, None);
    assert!(defaults.step_plan);
    let off = Settings::from_vars(vars(&[("VRAMFIT_ALLOC_PLAN", "off")])).unwrap();
    assert!(!off.step_plan);
    assert!(Settings::from_vars(vars(&[("VRAMFIT_ALLOC_PLAN", "maybe")])).is_err());
}

#[test]
fn bad_settings_are_refused_with_the_variable_named() {
    let err = Settings::from_vars(vars(&[("VRAMFIT_BUDGET_BYTES", "4G")])).unwrap_err();
    assert!(err.contains("VRAMFIT_BUDGET_BYTES"), "{err}");
    let err = Settings::from_vars(vars(&[("VRAMFIT_ALLOC_POLICY", "best")])).unwrap_err();
    assert!(err.contains("unknown allocator policy"), "{err}");
}
