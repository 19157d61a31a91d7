use super::*;

#[test]
fn kinds_and_splits() {
    assert_eq!(file_kind("image/png", "a.png", 10), ("image", "image"));
    assert_eq!(
        file_kind("image/png", "a.png", 11 * 1024 * 1024),
        ("stream", "file")
    );
    assert_eq!(file_kind("audio/opus", "v.opus", 10), ("opus", "audio"));
    assert_eq!(file_kind("video/mp4", "v.mp4", 10), ("mp4", "media"));
    assert_eq!(file_kind("application/pdf", "a.pdf", 10), ("pdf", "file"));
    assert_eq!(
        file_kind("application/octet-stream", "r.xlsx", 10),
        ("xls", "file")
    );
    assert_eq!(file_kind("text/plain", "a.txt", 10), ("stream", "file"));
    let parts = split_text(&format!("{}\n{}", "a".repeat(6000), "b".repeat(6000)), 8000);
    assert_eq!(parts.len(), 2);
    assert!(parts[0].ends_with('\n'));
    assert_eq!(split_text("  ", 10), Vec::<String>::new());
    assert_eq!(uuid_for("k", "s").len(), 40);
    assert_ne!(uuid_for("k", "s"), uuid_for("k", "t"));
}
