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
