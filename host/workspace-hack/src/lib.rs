//! Empty on purpose: this crate exists for its dependencies
//! (see `scripts/workspace-hack.py`).
