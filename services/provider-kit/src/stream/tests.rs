use std::sync::Mutex;

use switchyard_core::MemoryEphemeral;
use switchyard_core::provider::ProviderErrorKind;

use super::*;

/// A target that records what it was asked, answering ids 1, 2, ...
#[derive(Default)]
struct Target {
    created: Mutex<Vec<String>>,
    edits: Mutex<Vec<(u32, String)>>,
    /// The next edits are declined (a rate limit).
    decline: Mutex<u32>,
    /// The next create fails.
    fail_create: Mutex<bool>,
    /// No message can be shown (prepare answers None).
    nowhere: bool,
    /// A create takes this long (a slow send).
    create_delay: Duration,
}

#[async_trait]
impl Streaming for Target {
    type Id = u32;
    type Extra = String;

    async fn prepare(&self) -> Result<Option<String>, ProviderError> {
        Ok((!self.nowhere).then(|| "chat-1".to_owned()))
    }

    async fn create(&self, text: &str, extra: &String) -> Result<u32, ProviderError> {
        assert_eq!(extra, "chat-1");
        tokio::time::sleep(self.create_delay).await;
        if std::mem::take(&mut *self.fail_create.lock().unwrap()) {
            return Err(ProviderError::transient("target unavailable"));
        }
        let mut c = self.created.lock().unwrap();
        c.push(text.to_owned());
        Ok(c.len() as u32)
    }

    async fn edit(&self, id: &u32, text: &str) -> Result<Edited, ProviderError> {
        let mut d = self.decline.lock().unwrap();
        if *d > 0 {
            *d -= 1;
            return Ok(Edited::Skipped);
        }
        self.edits.lock().unwrap().push((*id, text.to_owned()));
        Ok(Edited::Done)
    }
}

fn limits(max_edits: Option<u32>) -> EditLimits {
    EditLimits {
        interval: Duration::from_millis(150),
        max_edits,
        ttl: Duration::from_secs(60),
    }
}

fn stream(eph: &Arc<MemoryEphemeral>, message_id: &str, max_edits: Option<u32>) -> DeltaStream {
    DeltaStream::new(
        eph.clone(),
        "kit:stream",
        "cch_1",
        message_id,
        limits(max_edits),
    )
}

fn eph() -> Arc<MemoryEphemeral> {
    Arc::new(MemoryEphemeral::new(10_000))
}

const GAP: Duration = Duration::from_millis(320);

#[tokio::test]
async fn create_then_edit_within_the_interval_then_settle() {
    let eph = eph();
    let t = Target::default();
    let s = stream(&eph, "msg_1", None);
    s.delta(&t, "   ").await.unwrap();
    s.delta(&t, "Hel").await.unwrap();
    s.delta(&t, "Hello wo").await.unwrap(); // within the interval: skipped
    tokio::time::sleep(GAP).await;
    s.delta(&t, "Hello world").await.unwrap();
    tokio::time::sleep(GAP).await;
    s.delta(&t, "Hello world").await.unwrap(); // unchanged: no call
    assert_eq!(*t.created.lock().unwrap(), vec!["Hel".to_owned()]);
    assert_eq!(
        *t.edits.lock().unwrap(),
        vec![(1, "Hello world".to_owned())]
    );
    let shown = s.settled::<u32, String>(Duration::ZERO).await.unwrap();
    assert_eq!((shown.id, shown.edits), (Some(1), 1));
    assert_eq!(shown.extra, "chat-1");
    assert!(s.edit_wait(&shown) <= Duration::from_millis(150));
    s.finish().await;
    assert!(s.read::<u32, String>().await.is_none());
    // Another answer streams its own message.
    stream(&eph, "msg_2", None).delta(&t, "Next").await.unwrap();
    assert_eq!(t.created.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn edits_stop_at_the_targets_limit() {
    let eph = eph();
    let t = Target::default();
    let s = stream(&eph, "msg_1", Some(2));
    s.delta(&t, "a").await.unwrap();
    for text in ["ab", "abc", "abcd"] {
        tokio::time::sleep(GAP).await;
        s.delta(&t, text).await.unwrap();
    }
    let edits: Vec<String> = t
        .edits
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.1.clone())
        .collect();
    assert_eq!(edits, vec!["ab".to_owned(), "abc".to_owned()]);
}

#[tokio::test]
async fn a_declined_edit_records_nothing_and_is_tried_again() {
    let eph = eph();
    let t = Target::default();
    let s = stream(&eph, "msg_1", None);
    s.delta(&t, "a").await.unwrap();
    *t.decline.lock().unwrap() = 1;
    tokio::time::sleep(GAP).await;
    s.delta(&t, "ab").await.unwrap();
    assert!(t.edits.lock().unwrap().is_empty());
    tokio::time::sleep(GAP).await;
    s.delta(&t, "ab").await.unwrap();
    assert_eq!(*t.edits.lock().unwrap(), vec![(1, "ab".to_owned())]);
}

#[tokio::test]
async fn one_creation_while_the_first_send_is_in_flight() {
    let eph = eph();
    let slow = Arc::new(Target {
        create_delay: Duration::from_millis(300),
        ..Target::default()
    });
    let first = {
        let (eph, slow) = (eph.clone(), slow.clone());
        tokio::spawn(async move { stream(&eph, "msg_1", None).delta(&*slow, "Hel").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = stream(&eph, "msg_1", None);
    // Another pod's delta: the creation is claimed, it shows nothing.
    s.delta(&*slow, "Hello").await.unwrap();
    // The final message waits for the first send's id rather than send a second message.
    let shown = s
        .settled::<u32, String>(Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(shown.id, Some(1));
    first.await.unwrap().unwrap();
    assert_eq!(slow.created.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_failed_creation_gives_the_claim_up() {
    let eph = eph();
    let t = Target::default();
    *t.fail_create.lock().unwrap() = true;
    let s = stream(&eph, "msg_1", None);
    let err = s.delta(&t, "Hel").await.unwrap_err();
    assert_eq!(err.kind, ProviderErrorKind::Transient);
    assert!(s.read::<u32, String>().await.is_none());
    s.delta(&t, "Hello").await.unwrap();
    assert_eq!(*t.created.lock().unwrap(), vec!["Hello".to_owned()]);
}

#[tokio::test]
async fn nothing_is_shown_where_there_is_nowhere_to_show_it() {
    let eph = eph();
    let t = Target {
        nowhere: true,
        ..Target::default()
    };
    let s = stream(&eph, "msg_1", None);
    s.delta(&t, "Hel").await.unwrap();
    assert!(t.created.lock().unwrap().is_empty());
    assert!(s.settled::<u32, String>(Duration::ZERO).await.is_none());
}
