"""Write use cases. Every function here is keyword-only, typed, runs in one transaction, checks the
invariants of docs/design.md §3, appends an Event and pushes a dashboard delta after commit."""
