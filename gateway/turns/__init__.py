"""The turn core both doors share: a turn admitted, sent, followed and closed (``runner``), what one caller may
ask of the pool (``limits``), whose a session is (``session_names``), the session's event log (``events``), and
why a turn will not run (``refusal``). Nothing here speaks HTTP: the server maps a refusal to a response, a
chat channel to a sentence."""
