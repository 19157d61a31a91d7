use super::*;

#[test]
fn split_respects_the_limit_and_prefers_breaks() {
    assert_eq!(split_text("hello", 4096), vec!["hello"]);
    assert!(split_text("  \n ", 4096).is_empty());
    let long = "word ".repeat(2000);
    let parts = split_text(&long, 4096);
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|p| units(p) <= 4096));
    assert!(parts[0].ends_with(' '), "split at a space");
    assert_eq!(parts.concat(), long.trim_end().to_owned() + " ");
    let lines = format!("{}\n{}", "a".repeat(3000), "b".repeat(3000));
    let parts = split_text(&lines, 4096);
    assert_eq!(parts[0], format!("{}\n", "a".repeat(3000)));
    // No break available: a hard cut, never inside a surrogate pair.
    let emoji = "😀".repeat(3000);
    let parts = split_text(&emoji, 4096);
    assert_eq!(units(&parts[0]), 4096);
    assert_eq!(parts.concat(), emoji);
}

#[test]
fn media_methods() {
    assert_eq!(media_method("image/png", "a.png", 1000).0, "sendPhoto");
    assert_eq!(
        media_method("image/png", "a.png", 11 * 1024 * 1024).0,
        "sendDocument"
    );
    assert_eq!(media_method("image/gif", "a.gif", 10).0, "sendDocument");
    assert_eq!(media_method("video/mp4", "a.mp4", 10).0, "sendVideo");
    assert_eq!(media_method("audio/ogg", "v.ogg", 10).0, "sendVoice");
    assert_eq!(media_method("audio/mpeg", "a.mp3", 10).0, "sendDocument");
    assert_eq!(
        media_method("application/pdf", "a.pdf", 10).0,
        "sendDocument"
    );
}

#[test]
fn message_id_arguments() {
    let mut args = Map::new();
    args.insert("m".into(), json!("-100:42"));
    assert_eq!(message_id_arg(&args, "m", -100, None).unwrap(), 42);
    assert!(message_id_arg(&args, "m", -200, None).is_err());
    // A message of the group before it became the supergroup -200: gone, not another chat's.
    let err = message_id_arg(&args, "m", -200, Some(-100)).unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Rejected);
    args.insert("m".into(), json!(7));
    assert_eq!(message_id_arg(&args, "m", 1, None).unwrap(), 7);
    args.insert("m".into(), json!("x"));
    assert!(message_id_arg(&args, "m", 1, None).is_err());
}
