use super::*;

#[derive(serde::Deserialize)]
struct Holder {
    #[serde(deserialize_with = "deserialize")]
    config: Map<String, Value>,
}

/// `{"config": {"k": [[ ... {"x": 1} ... ]]}}` whose `x` is `levels`
/// levels below the config object (`k` is one level below it).
fn nested(levels: usize) -> String {
    let mut inner = r#"{"x": 1}"#.to_string();
    for _ in 1..levels.saturating_sub(1) {
        inner = format!("[{inner}]");
    }
    format!(r#"{{"config": {{"model_type": "gpt2", "k": {inner}}}}}"#)
}

#[test]
fn an_object_nested_within_the_bound_is_read_as_it_is() {
    for levels in [2, 5, MAX_DEPTH] {
        let text = nested(levels);
        let want: Value = serde_json::from_str(&text).unwrap();
        let got: Holder = serde_json::from_str(&text).unwrap();
        assert_eq!(Value::Object(got.config), want["config"], "{levels}");
    }
    let plain: Holder = serde_json::from_str(
        r#"{"config": {"a": null, "b": true, "c": -3, "d": 2.5, "e": "s", "f": [1, {"g": 18446744073709551615}]}}"#,
    )
    .unwrap();
    assert_eq!(
        Value::Object(plain.config),
        serde_json::json!({"a": null, "b": true, "c": -3, "d": 2.5, "e": "s", "f": [1, {"g": u64::MAX}]})
    );
}

#[test]
fn deeper_values_are_dropped_and_named_instead_of_failing_the_document() {
    // Far past serde_json's own limit of 128, which failed every LIST.
    let text = nested(2000);
    assert!(
        serde_json::from_str::<Value>(&text).is_err(),
        "serde_json's limit"
    );
    let got: Holder = serde_json::from_str(&text).expect("read with the bound");
    assert_eq!(got.config["model_type"], "gpt2");
    let path = too_deep(&got.config).expect("named");
    assert_eq!(path, format!("k{}", "[0]".repeat(MAX_DEPTH)));
    // One level past the bound is dropped; at the bound it is not.
    let over: Holder = serde_json::from_str(&nested(MAX_DEPTH + 1)).unwrap();
    assert!(too_deep(&over.config).is_some());
    let at: Holder = serde_json::from_str(&nested(MAX_DEPTH)).unwrap();
    assert_eq!(too_deep(&at.config), None);
}

/// (serde_saphyr refuses much deeper documents itself, with an error.)
#[test]
fn the_bound_holds_for_yaml_too() {
    let text = nested(MAX_DEPTH + 20);
    let got: Holder = serde_saphyr::from_str(&text).expect("YAML is a superset of JSON");
    assert!(too_deep(&got.config).is_some());
}

/// The attack as the API server stores it: a LIST of TrainingJobs of which
/// one nests 2,000 levels deep in its config and in its template. The list
/// reads; that job fails its own validation, naming the field.
#[test]
fn a_list_with_one_deep_job_reads_and_that_job_is_invalid() {
    use crate::api::TrainingJob;
    let deep = |levels: usize| {
        let holder: Value = serde_json::from_str(&nested(3)).unwrap();
        let text = serde_json::to_string(&holder["config"]["k"]).unwrap();
        let mut inner = text;
        for _ in 0..levels {
            inner = format!("[{inner}]");
        }
        inner
    };
    let plain = serde_json::to_value(TrainingJob::test("plain").build()).unwrap();
    let mut bad = serde_json::to_value(
        TrainingJob::test("bad")
            .model(
                serde_json::json!({"huggingFace": {"seqLen": 8, "config": {"model_type": "gpt2"}}}),
            )
            .build(),
    )
    .unwrap()
    .to_string();
    bad = bad.replacen(
        r#""model_type":"gpt2""#,
        &format!(r#""model_type":"gpt2","rope_scaling":{}"#, deep(2000)),
        1,
    );
    bad = bad.replacen(
        r#""containers":"#,
        &format!(r#""extra":{},"containers":"#, deep(2000)),
        1,
    );
    let list = format!(
        r#"{{"apiVersion":"vramfit.dev/v1alpha1","kind":"TrainingJobList","metadata":{{}},"items":[{plain},{bad}]}}"#
    );
    let jobs: kube::core::ObjectList<TrainingJob> =
        serde_json::from_str(&list).expect("the list reads");
    assert_eq!(jobs.items.len(), 2);
    assert!(jobs.items[0].spec.pod_template().is_ok());
    let template = jobs.items[1].spec.pod_template().unwrap_err();
    assert!(
        template.starts_with("spec.template.spec.extra[0]")
            && template.ends_with("is nested deeper than 32 levels"),
        "{template}"
    );
    let hf = jobs.items[1].spec.model.hugging_face.as_ref().unwrap();
    let predicted = crate::predict::hf::arch_from_hugging_face(hf)
        .unwrap_err()
        .to_string();
    assert!(
        predicted.contains("huggingFace.config.rope_scaling[0]"),
        "{predicted}"
    );
}

/// A free-form field that is not an object is refused with what was
/// expected, as a typed map field would be.
#[test]
fn a_value_that_is_not_an_object_is_refused() {
    for text in [
        r#"{"config": "text"}"#,
        r#"{"config": [1, 2]}"#,
        r#"{"config": 3}"#,
    ] {
        let err = serde_json::from_str::<Holder>(text)
            .err()
            .expect(text)
            .to_string();
        assert!(err.contains("expected any JSON value"), "{text}: {err}");
    }
}
