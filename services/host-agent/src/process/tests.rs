use super::*;

#[tokio::test]
async fn line_reader_caps_and_handles_eof() {
    let long = "x".repeat(MAX_LINE_BYTES + 100);
    let input = format!("a\n{long}\nlast");
    let mut r = LineReader::new(BufReader::new(input.as_bytes()));
    assert_eq!(r.next_line().await.unwrap().as_deref(), Some("a"));
    assert_eq!(r.next_line().await.unwrap().unwrap().len(), MAX_LINE_BYTES);
    assert_eq!(r.next_line().await.unwrap().as_deref(), Some("last"));
    assert_eq!(r.next_line().await.unwrap(), None);
    assert_eq!(r.next_line().await.unwrap(), None);
}

#[test]
fn lists_regular_files_recursively() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("b.txt"), "bb").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    std::fs::write(d.path().join("sub/a.csv"), "a").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", d.path().join("link")).unwrap();
    let files: Vec<_> = list_files(d.path())
        .into_iter()
        .map(|(n, _, s)| (n, s))
        .collect();
    assert_eq!(files, [("b.txt".into(), 2), ("sub/a.csv".into(), 1)]);
    assert!(list_files(&d.path().join("missing")).is_empty());
}

#[test]
fn describes_exit_statuses() {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        describe(ExitStatus::from_raw(3 << 8)),
        "exited with status 3"
    );
    assert_eq!(describe(ExitStatus::from_raw(9)), "was killed by signal 9");
}
