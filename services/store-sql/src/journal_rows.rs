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
pub fn pack(entries: &[JournalRecord]) -> Vec<Packed<'_>> {
    let mut rows: Vec<Packed<'_>> = Vec::new();
    let mut open: HashMap<(&str, &str, &str, &str), usize> = HashMap::new();
    for e in entries {
        let key = (
            e.message_id.as_str(),
            e.tenant_id.as_str(),
            e.channel_id.as_str(),
            e.pod_id.as_str(),
        );
        let i = match open.get(&key) {
            Some(&i) if rows[i].n < PER_ROW => i,
            _ => {
                rows.push(Packed {
                    first: e,
                    at: e.at,
                    n: 0,
                    steps: String::new(),
                });
                open.insert(key, rows.len() - 1);
                rows.len() - 1
            }
        };
        let r = &mut rows[i];
        r.at = r.at.min(e.at);
        r.n += 1;
        r.steps.push_str(&e.at.to_string());
        r.steps.push('\t');
        r.steps.extend(e.step.chars().filter(|c| !c.is_control()));
        r.steps.push('\t');
        r.steps.extend(e.detail.chars().filter(|c| !c.is_control()));
        r.steps.push('\n');
    }
    rows
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
