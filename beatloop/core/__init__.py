"""The engine in nine wings, lowest first: failures, schedule, data, saving, devices,
compiled, feeding, events, running; each imports only its own and lower wings."""
