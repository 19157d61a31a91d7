//! The delivery journal's row format, shared by every SQL backend: one insert batch stores the
//! steps one pod recorded for a message as one row (at most [`PER_ROW`] steps, `at\tstep\tdetail`
//! lines in `steps`), which at saturation is about one row per message instead of five, and so
//! a fifth of the random inserts into the message index. A step's id is `row id * PER_ROW +
//! its place in the row`, so ids still follow insert order and a channel's journal pages by
//! step id. The per-tenant cap counts rows (a message's burst of steps), not single steps.

use std::collections::HashMap;

use switchyard_core::model::JournalRecord;

/// Most steps in one row; a step's id is its row id times this plus its place in the row.
pub const PER_ROW: i64 = 16;

/// One row to insert: the first step's ids, the earliest time, the packed steps.
#[derive(Debug)]
pub struct Packed<'a> {
    pub first: &'a JournalRecord,
    pub at: i64,
    pub n: i64,
    pub steps: String,
}

/// Groups a batch by message (and tenant, channel, pod), in order of first appearance, at
/// most [`PER_ROW`] steps a row. Steps end in `\n`; control characters in a step or detail
/// are dropped so they cannot split it.
///
/// It runs for every step a pod records, so it keeps to one seeded hash of the message id, no
/// allocation per step (a row's text is sized once) and a plain copy of text that holds no
/// control character (what `Journal::record` hands over: it already strips them).
pub fn pack(entries: &[JournalRecord]) -> Vec<Packed<'_>> {
    let mut rows: Vec<Packed<'_>> = Vec::with_capacity(entries.len());
    // The message's open row; a step of the same message id from another tenant, channel or
    // pod (only a client reusing ids across them) starts a row of its own.
    let mut open: HashMap<&str, usize, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(entries.len(), Default::default());
    let mut digits = itoa::Buffer::new();
    for e in entries {
        let same = |r: &Packed<'_>| {
            r.n < PER_ROW
                && r.first.tenant_id == e.tenant_id
                && r.first.channel_id == e.channel_id
                && r.first.pod_id == e.pod_id
        };
        let i = match open.get(e.message_id.as_str()) {
            Some(&i) if same(&rows[i]) => i,
            _ => {
                rows.push(Packed {
                    first: e,
                    at: e.at,
                    n: 0,
                    steps: String::with_capacity(ROW_TEXT),
                });
                open.insert(e.message_id.as_str(), rows.len() - 1);
                rows.len() - 1
            }
        };
        let r = &mut rows[i];
        r.at = r.at.min(e.at);
        r.n += 1;
        r.steps.push_str(digits.format(e.at));
        r.steps.push('\t');
        push_clean(&mut r.steps, &e.step);
        r.steps.push('\t');
        push_clean(&mut r.steps, &e.detail);
        r.steps.push('\n');
    }
    rows
}

/// A row's text is sized for a message's usual steps (five or six lines of about 40 bytes).
const ROW_TEXT: usize = 256;

/// Appends `s` without its control characters: a copy when it has none (checked on bytes:
/// printable ASCII is never one), else char by char.
fn push_clean(out: &mut String, s: &str) {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        out.push_str(s);
    } else {
        out.extend(s.chars().filter(|c| !c.is_control()));
    }
}

/// The statement sizes (rows per multi-row insert) a batch is cut into, largest first. A
/// batch of any length is a handful of statements of these few shapes, so each connection's
/// cache of prepared statements keeps them. A multi-row insert of a new length is parsed and
/// planned again: that was about 3 % of an embedded pod's instructions at 100 messages a
/// second (callgrind), as much as the journal's inserts themselves.
pub const INSERT_SIZES: [usize; 5] = [256, 64, 16, 4, 1];

/// `items` cut into consecutive chunks of [`INSERT_SIZES`], largest first.
pub fn insert_chunks<T>(mut items: &[T]) -> Vec<&[T]> {
    let mut out = Vec::new();
    for size in INSERT_SIZES {
        while items.len() >= size {
            let (head, tail) = items.split_at(size);
            out.push(head);
            items = tail;
        }
    }
    out
}

/// A stored row's columns.
pub struct StoredRow {
    pub id: i64,
    pub tenant_id: String,
    pub channel_id: String,
    pub message_id: String,
    pub pod_id: String,
    pub steps: String,
}

/// A stored row back as its steps, in insert order.
pub fn unpack(row: &StoredRow) -> Vec<JournalRecord> {
    row.steps
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let mut parts = line.splitn(3, '\t');
            let at = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            JournalRecord {
                id: row.id * PER_ROW + i as i64,
                tenant_id: row.tenant_id.clone(),
                channel_id: row.channel_id.clone(),
                message_id: row.message_id.clone(),
                step: parts.next().unwrap_or_default().to_owned(),
                detail: parts.next().unwrap_or_default().to_owned(),
                pod_id: row.pod_id.clone(),
                at,
            }
        })
        .collect()
}

/// The row that holds the steps with ids below `before_id`: rows up to this id.
pub fn row_below(before_id: Option<i64>) -> i64 {
    before_id
        .unwrap_or(i64::MAX)
        .saturating_sub(1)
        .div_euclid(PER_ROW)
}

/// A channel's steps newest first from its rows newest first, those with an id below
/// `before_id`, at most `limit`.
pub fn newest_first(
    rows: &[StoredRow],
    before_id: Option<i64>,
    limit: usize,
) -> Vec<JournalRecord> {
    let before = before_id.unwrap_or(i64::MAX);
    let mut out = Vec::new();
    for row in rows {
        let mut steps = unpack(row);
        steps.reverse();
        out.extend(steps.into_iter().filter(|e| e.id < before));
        if out.len() >= limit {
            break;
        }
    }
    out.truncate(limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(msg: &str, step: &str, at: i64) -> JournalRecord {
        JournalRecord {
            id: 0,
            tenant_id: "t".into(),
            channel_id: "c".into(),
            message_id: msg.into(),
            step: step.into(),
            detail: "a\tb\nc".into(),
            pod_id: "p".into(),
            at,
        }
    }

    #[test]
    fn a_batch_packs_by_message_and_caps_a_row() {
        let mut batch = vec![rec("m1", "accepted", 5), rec("m2", "accepted", 3)];
        batch.extend((0..PER_ROW).map(|i| rec("m1", "attempt", 4 + i)));
        let rows = pack(&batch);
        let shape: Vec<(&str, i64, i64)> = rows
            .iter()
            .map(|r| (r.first.message_id.as_str(), r.n, r.at))
            .collect();
        assert_eq!(
            shape,
            [("m1", PER_ROW, 4), ("m2", 1, 3), ("m1", 1, 4 + PER_ROW - 1)]
        );
        assert!(rows[0].steps.starts_with("5\taccepted\tabc\n4\tattempt\t"));
    }

    #[test]
    fn control_characters_go_and_other_text_stays_whatever_its_script() {
        let mut r = rec("m1", "acked", 1);
        r.detail = "rejected: d\u{e9}j\u{e0} vu\u{85}\u{7f}\r\n\u{4e2d}".into();
        let rows = pack(std::slice::from_ref(&r));
        assert_eq!(
            rows[0].steps,
            "1\tacked\trejected: d\u{e9}j\u{e0} vu\u{4e2d}\n"
        );
        let mut out = String::new();
        push_clean(&mut out, "plain ascii ~ 0-9");
        assert_eq!(out, "plain ascii ~ 0-9");
    }

    #[test]
    fn a_message_id_reused_by_another_channel_or_pod_gets_its_own_row() {
        let mut other_channel = rec("m1", "stored", 2);
        other_channel.channel_id = "c2".into();
        let mut other_pod = rec("m1", "sent", 3);
        other_pod.pod_id = "p2".into();
        let batch = [
            rec("m1", "accepted", 1),
            other_channel,
            other_pod,
            rec("m1", "acked", 4),
        ];
        let rows = pack(&batch);
        let shape: Vec<(&str, &str, i64)> = rows
            .iter()
            .map(|r| (r.first.channel_id.as_str(), r.first.pod_id.as_str(), r.n))
            .collect();
        // The first row is no longer the open one once another took the id: a later step of
        // it starts a fourth row, still with its own channel and pod.
        assert_eq!(
            shape,
            [("c", "p", 1), ("c2", "p", 1), ("c", "p2", 1), ("c", "p", 1)]
        );
        assert!(rows.iter().all(|r| r.first.message_id == "m1"));
    }

    #[test]
    fn a_batch_is_cut_into_the_few_statement_sizes_in_order() {
        let items: Vec<u32> = (0..1000).collect();
        let chunks = insert_chunks(&items);
        let sizes: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
        // 3 x 256, 3 x 64, 2 x 16, 2 x 4: 1000 exactly, nothing left.
        assert_eq!(sizes, [256, 256, 256, 64, 64, 64, 16, 16, 4, 4]);
        let joined: Vec<u32> = chunks.concat();
        assert_eq!(joined, items, "every item once, in order");
        assert_eq!(insert_chunks(&items[..7]).len(), 4, "4 + 1 + 1 + 1");
        assert!(insert_chunks::<u32>(&[]).is_empty());
    }

    #[test]
    fn a_row_unpacks_to_its_steps_with_ids_in_insert_order() {
        let batch = [rec("m1", "accepted", 5), rec("m1", "stored", 6)];
        let rows = pack(&batch);
        let stored = StoredRow {
            id: 3,
            tenant_id: "t".into(),
            channel_id: "c".into(),
            message_id: "m1".into(),
            pod_id: "p".into(),
            steps: rows[0].steps.clone(),
        };
        let steps = unpack(&stored);
        let got: Vec<(i64, &str, &str, i64)> = steps
            .iter()
            .map(|s| (s.id, s.step.as_str(), s.detail.as_str(), s.at))
            .collect();
        assert_eq!(got, [(48, "accepted", "abc", 5), (49, "stored", "abc", 6)]);
        // Paging below the second step's id keeps the first only.
        assert_eq!(row_below(Some(49)), 3);
        let page = newest_first(&[stored], Some(49), 10);
        assert_eq!(page.iter().map(|s| s.id).collect::<Vec<_>>(), [48]);
    }
}
