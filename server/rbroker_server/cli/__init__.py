"""The `rbroker-server` command: the parser and dispatch (`main`), one module per command
(`setup`, `serve`, `group`, `enroll_code`, `token`, `computer`, `db_cmd`), what they share
(`common`) and the checks that make a failure to start one line (`startup`)."""
