"""The decoding runtime every kind drafts with: draft trees, proposer types, acceptance rules, KV-cache
handling."""
