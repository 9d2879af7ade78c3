"""WebSocket adapters, one module per socket: `dashboard` (the pages' feed), `agent` (the agent link) and
`driver` (the driver link); `common` holds what they share. Thin: authenticate, parse, call a service or a
selector, answer. All state lives in the database; a socket only ever mirrors it."""
