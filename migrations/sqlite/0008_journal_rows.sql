-- Switchyard schema, version 8 (sqlite): version 6's `journal` table leaves the main file. On
-- SQLite the delivery journal has lived in a database file of its own since build 7
-- (`switchyard.journal.db`, with its own writer and packed rows), so no build within one
-- version of this schema reads or writes the table: dropping it is safe under the
-- expand/contract rule (docs/ops.md).
DROP TABLE journal;
