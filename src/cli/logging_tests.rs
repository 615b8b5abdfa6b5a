use super::*;
use std::sync::{Arc, Mutex};

/// A writer into a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged(format: LogFormat, colour: bool) -> String {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = subscriber(
        format,
        EnvFilter::new("info"),
        move || writer.clone(),
        colour,
    );
    tracing::subscriber::with_default(subscriber, || {
        tracing::info!(job = "train", decision = "placed", attempt = 2, "decision");
        tracing::debug!("filtered out");
    });
    String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
}

#[test]
fn json_lines_carry_the_fields_at_the_top_level() {
    let text = logged(LogFormat::Json, true);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let line: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON object");
    assert_eq!(line["message"], "decision");
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["job"], "train");
    assert_eq!(line["decision"], "placed");
    assert_eq!(line["attempt"], 2);
    assert!(line["timestamp"].is_string());
    assert!(!text.contains('\u{1b}'), "no colour codes in JSON");
}

#[test]
fn text_has_colour_codes_only_when_asked() {
    let plain = logged(LogFormat::Text, false);
    assert!(plain.contains("decision"), "{plain}");
    assert!(plain.contains("job=\"train\""), "{plain}");
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
    assert!(logged(LogFormat::Text, true).contains('\u{1b}'));
}
