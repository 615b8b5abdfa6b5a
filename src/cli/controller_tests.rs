use clap::Parser;

use super::ControllerArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ControllerArgs,
}

fn parse(extra: &[&str]) -> Result<ControllerArgs, clap::Error> {
    let argv = std::iter::once("vramfit").chain(extra.iter().copied());
    Cli::try_parse_from(argv).map(|c| c.args)
}

#[test]
fn the_default_compute_share_is_a_percentage_or_unset() {
    assert_eq!(parse(&[]).unwrap().options().compute_default, None);
    for (arg, want) in [("1", 1), ("60", 60), ("100", 100)] {
        let flag = format!("--default-gpu-compute-percent={arg}");
        let options = parse(&[flag.as_str()]).unwrap().options();
        assert_eq!(options.compute_default, Some(want), "{arg}");
    }
    for bad in ["0", "101", "half"] {
        let flag = format!("--default-gpu-compute-percent={bad}");
        assert!(parse(&[flag.as_str()]).is_err(), "{bad} accepted");
    }
}
