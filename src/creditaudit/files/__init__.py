"""Files: strict JSON (:mod:`~creditaudit.files.strict_json`), writes that never leave a
half-written file (:mod:`~creditaudit.files.safe_files`) and the signed user cache
(:mod:`~creditaudit.files.cache`)."""
