"""``fedshift data check``: how the sites of a federation differ, one score per shift axis
(:mod:`.measure`), the report and its recommendation (:mod:`.report`), its figures
(:mod:`.figures`) and the images' files on disk (:mod:`.files`)."""
