use super::*;

fn api(code: u16) -> Error {
    let status = kube::core::Status::failure("x", "y").with_code(code);
    Error::Kube(kube::Error::Api(Box::new(status)))
}

#[test]
fn each_error_gets_its_label_and_retry() {
    let transport = Error::Kube(kube::Error::Service("connection refused".into()));
    let in_finalizer = |e: Error| Error::Finalizer(Box::new(FinalizerError::ApplyFailed(e)));
    let adding = |code: u16| {
        let Error::Kube(e) = api(code) else {
            unreachable!()
        };
        Error::Finalizer(Box::new(FinalizerError::AddFinalizer(e)))
    };
    let cases = [
        (api(409), "conflict", CONFLICT_RETRY),
        (api(404), "not_found", CONFLICT_RETRY),
        (api(429), "throttled", THROTTLED_RETRY),
        (api(500), "server", SERVER_RETRY),
        (api(503), "server", SERVER_RETRY),
        (api(499), "rejected", REJECTED_RETRY),
        (api(422), "rejected", REJECTED_RETRY),
        (api(403), "rejected", REJECTED_RETRY),
        (transport, "transport", SERVER_RETRY),
        (in_finalizer(api(409)), "conflict", CONFLICT_RETRY),
        (
            Error::Finalizer(Box::new(FinalizerError::CleanupFailed(api(500)))),
            "server",
            SERVER_RETRY,
        ),
        (adding(503), "server", SERVER_RETRY),
        (
            Error::Finalizer(Box::new(FinalizerError::RemoveFinalizer(
                kube::Error::Service("reset".into()),
            ))),
            "transport",
            SERVER_RETRY,
        ),
        (
            Error::Finalizer(Box::new(FinalizerError::UnnamedObject)),
            "finalizer",
            REJECTED_RETRY,
        ),
        (Error::Yaml("bad".into()), "serialisation", REJECTED_RETRY),
        (
            Error::Json(serde_json::from_str::<u8>("x").unwrap_err()),
            "serialisation",
            REJECTED_RETRY,
        ),
        (
            Error::Io {
                path: "p".into(),
                source: std::io::Error::other("x"),
            },
            "io",
            REJECTED_RETRY,
        ),
        (
            Error::LeadershipLost("x".into()),
            "leadership",
            REJECTED_RETRY,
        ),
        (Error::Leadership("x".into()), "leadership", REJECTED_RETRY),
        (
            Error::TaskStopped {
                task: "t",
                reason: "r".into(),
            },
            "task",
            REJECTED_RETRY,
        ),
    ];
    for (error, kind, delay) in cases {
        assert_eq!(error_kind(&error), kind, "{error}");
        assert_eq!(retry_delay(&error), delay, "{error}");
    }
}

#[test]
fn a_refused_pod_create_is_a_rejection_and_a_passing_fault_is_not() {
    let status =
        |code: u16, message: &str| kube::core::Status::failure(message, "R").with_code(code);
    let quota = "pods \"p\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1";
    let cases = [
        (
            403,
            "violates PodSecurity \"baseline:latest\": hostPath volumes",
            Some("Forbidden"),
        ),
        (403, quota, Some("QuotaExceeded")),
        (
            422,
            "Pod \"p\" is invalid: spec.containers[0].image: Required value",
            Some("Invalid"),
        ),
        (400, "bad request", Some("BadRequest")),
        (409, "already exists", None),
        (404, "namespaces \"x\" not found", None),
        (429, "too many requests", None),
        (500, "etcd timeout", None),
        (504, "timeout", None),
    ];
    for (code, message, want) in cases {
        let got = pod_rejection(&status(code, message));
        assert_eq!(got.as_ref().map(|r| r.reason), want, "{code} {message}");
        if let Some(r) = got {
            assert_eq!(r.message, message, "the API server's message is kept");
        }
    }
}
