use super::*;

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

#[test]
fn the_ui_gets_its_own_listener_unless_it_shares_the_metrics_address() {
    let both = Pages {
        metrics: true,
        ui: true,
    };
    let metrics = Pages {
        metrics: true,
        ui: false,
    };
    let ui = Pages {
        metrics: false,
        ui: true,
    };
    let cases = [
        (
            Some("0.0.0.0:8080"),
            Some("127.0.0.1:8081"),
            vec![("0.0.0.0:8080", metrics), ("127.0.0.1:8081", ui)],
        ),
        (
            Some("127.0.0.1:9000"),
            Some("127.0.0.1:9000"),
            vec![("127.0.0.1:9000", both)],
        ),
        (Some("0.0.0.0:8080"), None, vec![("0.0.0.0:8080", metrics)]),
        (None, Some("127.0.0.1:8081"), vec![("127.0.0.1:8081", ui)]),
        (None, None, vec![]),
    ];
    for (m, u, want) in cases {
        let want: Vec<(SocketAddr, Pages)> = want.into_iter().map(|(a, p)| (addr(a), p)).collect();
        assert_eq!(listeners(m.map(addr), u.map(addr)), want, "{m:?} {u:?}");
    }
}
