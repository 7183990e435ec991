

def test_turn_marks_have_one_typed_home() -> None:
    from memory.sessions import Marks, TranscriptEntry

    written = Marks(message_id="m1", iteration=2, model="gpt", usage={"total_tokens": 9}, final=True).metadata()
    assert written == {"message_id": "m1", "iteration": 2, "model": "gpt", "usage": {"total_tokens": 9},
                       "final": True}  # defaults (not stopped, not cancelled) are not written
    entry = TranscriptEntry(role="assistant", content="done", metadata=written)
    assert entry.marks.final and entry.marks.iteration == 2 and entry.marks.stopped is None
    tool = TranscriptEntry(role="tool", content="x", metadata={"message_id": "m1", "success": True, "sandbox": "bwrap"})
    assert tool.marks.model_extra == {"success": True, "sandbox": "bwrap"}  # a tool's facts ride along
    odd = TranscriptEntry(role="assistant", content="?", metadata={"iteration": "soon"})
    assert odd.marks == Marks()  # a malformed mark reads as unmarked, never a crash in a resume
