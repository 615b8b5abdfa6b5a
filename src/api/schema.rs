//! Hand-written schema fragments for fields whose Rust type does not say enough.

use schemars::{Schema, SchemaGenerator, json_schema};

/// An object whose fields are kept as given (for example a model's config.json).
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A pod template. Kept free-form in the CRD so the CRD stays small (the full
/// PodTemplateSpec schema is several hundred kilobytes); the controller parses it
/// into a typed `PodTemplateSpec` and reports a template that does not parse as
/// an `Invalid` condition.
pub fn pod_template(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A Kubernetes quantity such as `20Gi`, checked by the API server's CEL
/// quantity library.
pub fn quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 64,
        "x-kubernetes-validations": [{
            "rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
            "message": "must be a positive quantity such as 20Gi or 24000Mi",
        }],
    })
}

/// A duration such as `2h`, `90m` or `1d12h`: whole numbers with units `d`,
/// `h`, `m` or `s`, at most four of them, the first not zero
/// (`crate::controller::progress::parse_duration` reads it).
pub fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": DURATION_PATTERN,
    })
}

/// The pattern of [`duration`].
pub const DURATION_PATTERN: &str = "^[1-9][0-9]{0,6}[dhms]([0-9]{1,7}[dhms]){0,3}$";
