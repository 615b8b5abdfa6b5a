//! Integration tests against a real kube-apiserver + etcd started locally by
//! `hack/controlplane.sh`.

mod agent;
mod api_validation;
mod controller;
mod controlplane;
mod driver;
mod faults;
mod follow;
mod run_local;
mod tenants;
mod ui;
