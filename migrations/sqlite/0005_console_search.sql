-- Switchyard schema, version 5 (sqlite): the console's search. A filtered page is still one
-- keyset query: these indexes put a tenant's, a Card's or a status's rows in the page's order,
-- so the walk starts at the cursor and stops after a page of matches.

-- Channels and bindings in id order, by tenant, by Card, by Descriptor status.
CREATE INDEX channels_tenant_id ON channels (tenant_id, id);
CREATE INDEX channels_card_id ON channels (card_id, id);
CREATE INDEX channels_status_id ON channels (status, id);
-- Runs newest first, by tenant and by state.
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at, id);
CREATE INDEX runs_state_created ON runs (state, created_at, id);
