-- May Redis have lost state a moment ago (LaneStore.state_uncertain)? The refusal the scripts
-- that start or keep a run make (epoch_refusal.lua), asked on its own.
-- KEYS[1] epoch record. Returns the reason ('epoch-unknown', 'server-changed', 'quarantine'),
-- or false when state is known intact.
-- include: epoch_refusal
return epoch_refusal(KEYS[1]) or false
