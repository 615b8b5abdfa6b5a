//! Checks a TrainingJob as the API server does, before anything reads it:
//! the defaults, then the structural schema of the generated CRD (types,
//! bounds, enums, required and unknown fields), then its CEL rules. Each
//! problem names the field, `spec.model.optimizer: ...`, so `vramfit predict
//! -f` refuses what `kubectl apply` would refuse, with the same paths.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::extractors::This;
use cel::objects::Value as Cel;
use kube::CustomResourceExt;
use serde_json::{Map, Value};

use super::TrainingJob;
use crate::quantity::parse_quantity;

/// The CRD's OpenAPI schema, made strict the way the API server treats a
/// structural schema: an object with declared properties has no others,
/// unless it preserves unknown fields.
static SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    let crd = TrainingJob::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).expect("the CRD schema serializes"))
        .unwrap_or_default();
    let mut schema = schema;
    // The API server checks these itself; the CRD schema leaves them out.
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.insert("apiVersion".into(), serde_json::json!({"type": "string"}));
        properties.insert("kind".into(), serde_json::json!({"type": "string"}));
        properties.insert("metadata".into(), serde_json::json!({"type": "object"}));
    }
    make_strict(&mut schema);
    schema
});

static VALIDATOR: LazyLock<jsonschema::Validator> = LazyLock::new(|| {
    jsonschema::draft4::options()
        .should_validate_formats(false)
        .build(&SCHEMA)
        .expect("the CRD schema is a valid JSON schema")
});

/// Checks a whole TrainingJob document (`apiVersion`, `kind`, `metadata`,
/// `spec`). On success returns the document with the CRD's defaults applied.
pub fn validate_training_job(document: &Value) -> Result<Value, Vec<String>> {
    let mut document = document.clone();
    if let Some(kind) = document.get("kind").and_then(Value::as_str)
        && kind != "TrainingJob"
    {
        return Err(vec![format!("kind: expected TrainingJob, got {kind:?}")]);
    }
    apply_defaults(&SCHEMA, &mut document);
    let mut errors: Vec<String> = VALIDATOR
        .iter_errors(&document)
        .flat_map(|e| describe(&e))
        .collect();
    if errors.is_empty() {
        check_rules(&SCHEMA, &document, "", &mut errors);
    }
    if errors.is_empty()
        && let Some(template) = document
            .pointer("/spec/template")
            .and_then(Value::as_object)
        && let Err(message) = super::check_pod_template(template)
    {
        errors.push(message);
    }
    errors.sort();
    errors.dedup();
    if errors.is_empty() {
        Ok(document)
    } else {
        Err(errors)
    }
}

fn make_strict(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let preserves = object
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if object.contains_key("properties")
        && !preserves
        && !object.contains_key("additionalProperties")
    {
        object.insert("additionalProperties".into(), Value::Bool(false));
    }
    // `nullable: true` lets a field be null, as the API server allows.
    if object.get("nullable").and_then(Value::as_bool) == Some(true)
        && let Some(Value::String(kind)) = object.get("type").cloned()
    {
        object.insert("type".into(), serde_json::json!([kind, "null"]));
    }
    for (key, child) in object.iter_mut() {
        match key.as_str() {
            "properties" => {
                if let Some(properties) = child.as_object_mut() {
                    properties.values_mut().for_each(make_strict);
                }
            }
            "items" | "additionalProperties" | "not" => make_strict(child),
            "allOf" | "anyOf" | "oneOf" => {
                if let Some(list) = child.as_array_mut() {
                    list.iter_mut().for_each(make_strict);
                }
            }
            _ => {}
        }
    }
    // The API server fills in and owns these; a manifest may carry status.
    if let Some(Value::Object(properties)) = object.get_mut("properties")
        && let Some(Value::Object(status)) = properties.get_mut("status")
    {
        status.remove("additionalProperties");
    }
}

/// Fills in the schema's defaults where a field is absent, as the API server
/// does before it validates.
fn apply_defaults(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(object) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (name, property) in properties {
                    if !object.contains_key(name)
                        && let Some(default) = property.get("default")
                    {
                        object.insert(name.clone(), default.clone());
                    }
                    if let Some(child) = object.get_mut(name) {
                        apply_defaults(property, child);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items
                    .iter_mut()
                    .for_each(|item| apply_defaults(item_schema, item));
            }
        }
        _ => {}
    }
}

/// `spec.model.transformer` from the location `/spec/model/transformer`.
fn field_path(location: &jsonschema::paths::Location) -> String {
    let mut path = String::new();
    for segment in location.segments() {
        match segment {
            jsonschema::paths::LocationSegment::Index(index) => {
                path.push_str(&format!("[{index}]"))
            }
            jsonschema::paths::LocationSegment::Property(name) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&name);
            }
        }
    }
    path
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn describe(error: &jsonschema::ValidationError<'_>) -> Vec<String> {
    let path = field_path(error.instance_path());
    match error.kind() {
        jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
            .iter()
            .map(|name| format!("{}: unknown field {name:?}", join(&path, name)))
            .collect(),
        jsonschema::error::ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_string);
            vec![format!("{}: Required value", join(&path, &name))]
        }
        _ => {
            let at = if path.is_empty() { "(root)" } else { &path };
            vec![format!("{at}: {error}")]
        }
    }
}

/// Evaluates the `x-kubernetes-validations` rules of every schema node whose
/// value is present, with `self` bound to that value.
fn check_rules(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for rule in rules {
            let Some(expression) = rule.get("rule").and_then(Value::as_str) else {
                continue;
            };
            let message = rule
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| format!("failed rule: {expression}"), str::to_string);
            let at = join(
                path,
                rule.get("fieldPath")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .trim_start_matches('.'),
            );
            let at = at.trim_end_matches('.');
            match evaluate(expression, value) {
                Ok(true) => {}
                Ok(false) => errors.push(format!("{at}: Invalid value: {message}")),
                Err(problem) => errors.push(format!("{at}: {message} ({problem})")),
            }
        }
    }
    match value {
        Value::Object(object) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (name, property) in properties {
                    if let Some(child) = object.get(name) {
                        check_rules(property, child, &join(path, name), errors);
                    }
                }
            } else if let Some(entry) = schema.get("additionalProperties").filter(|s| s.is_object())
            {
                for (name, child) in object {
                    check_rules(entry, child, &join(path, name), errors);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check_rules(item_schema, item, &format!("{path}[{index}]"), errors);
                }
            }
        }
        _ => {}
    }
}

fn evaluate(expression: &str, value: &Value) -> Result<bool, String> {
    let program = cel::Program::compile(expression).map_err(|e| e.to_string())?;
    let mut context = cel::Context::default();
    // The Kubernetes quantity library: a quantity is kept as its text.
    context
        .add_function("isQuantity", |text: Arc<String>| is_quantity(&text))
        .map_err(|e| e.to_string())?;
    context
        .add_function("quantity", |text: Arc<String>| Cel::String(text))
        .map_err(|e| e.to_string())?;
    context
        .add_function(
            "isGreaterThan",
            |This(this): This<Arc<String>>, other: Arc<String>| {
                matches!(
                    (signed_milli(&this), signed_milli(&other)),
                    (Some(a), Some(b)) if a > b
                )
            },
        )
        .map_err(|e| e.to_string())?;
    context.add_variable_from_value("self", to_cel(value));
    match program.execute(&context) {
        Ok(Cel::Bool(result)) => Ok(result),
        Ok(other) => Err(format!("the rule gave {other:?}, not a boolean")),
        Err(error) => Err(error.to_string()),
    }
}

fn is_quantity(text: &str) -> bool {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    text.trim() == text && parse_quantity(unsigned, 1).is_some()
}

fn signed_milli(text: &str) -> Option<i128> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let magnitude = i128::from(parse_quantity(unsigned, 1000)?);
    Some(if negative { -magnitude } else { magnitude })
}

/// JSON as CEL sees it: integers are `int`, as in the API server.
fn to_cel(value: &Value) -> Cel {
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Cel::Int(i),
            None => n
                .as_u64()
                .map(Cel::UInt)
                .unwrap_or_else(|| Cel::Float(n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(items) => Cel::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(object) => {
            let map: HashMap<String, Cel> =
                object.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            Cel::from(map)
        }
    }
}

/// Wraps a bare spec into a TrainingJob document. A bare spec describes the
/// training only, so its pod template may be left out.
pub fn as_document(mut spec: Map<String, Value>) -> Value {
    spec.entry("template")
        .or_insert_with(|| Value::Object(Map::new()));
    serde_json::json!({
        "apiVersion": "vramfit.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "job"},
        "spec": spec,
    })
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
