"""Write use cases. Every function here is keyword-only, typed, runs in one transaction, checks the
invariants of DESIGN §4, appends an Event and pushes a dashboard delta after commit."""
