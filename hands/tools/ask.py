"""The ask_user tool: one to three questions to the person of the turn, through the door they use.

What the model learns is data, never a failure: ``{"answers": [...]}`` (one per question, in order) or
``{"no_answer": true, "reason": ...}`` when nobody answered in time or nobody is there to ask (a job's turn).
"""

from __future__ import annotations

from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.questions import shown_question
from hands.registry import Category, ToolContext, ToolDefinition

ASK_USER = "ask_user"
MAX_QUESTIONS, MAX_CHOICES = 3, 6
QUESTION_CHARS, CHOICE_CHARS = 1_000, 60

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array", "minItems": 1, "maxItems": MAX_QUESTIONS,
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "minLength": 1, "maxLength": QUESTION_CHARS,
                             "description": "The question, as the person will read it"},
                    "choices": {"type": "array", "maxItems": MAX_CHOICES, "uniqueItems": True,
                                "items": {"type": "string", "minLength": 1, "maxLength": CHOICE_CHARS},
                                "description": "Short answers to pick from (none: the person writes one)"},
                },
                "required": ["text"], "additionalProperties": False,
            },
        },
    },
    "required": ["questions"], "additionalProperties": False,
}


async def ask_user(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if ctx.questions is None or ctx.call is None:
        return {"no_answer": True, "reason": "this worker cannot reach people; decide without them"}
    questions = []
    for n, item in enumerate(args["questions"]):
        choices = [" ".join(c.split()) for c in item.get("choices", [])]
        if not item["text"].strip() or any(not c for c in choices) or len(set(choices)) < len(choices):
            raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"questions/{n}: a question needs words, and its "
                              "choices must each say something and differ from one another",
                              suggestions=["write each choice as a few distinct words"])
        questions.append(shown_question(item["text"].strip(), choices))
    asked = await ctx.questions.ask(ctx.call, questions)
    if asked.answers is None:
        return {"no_answer": True, "reason": asked.reason}
    return {"answers": asked.answers, "by": asked.by}


PERSON_TOOLS = [
    ToolDefinition(
        name=ASK_USER,
        description=("Ask the person you are working for one to three short questions and wait for their "
                     "answers. Give choices when the answer is one of a few (they tap one), none when they "
                     "should write it. Ask only what you cannot find out or sensibly decide yourself. The "
                     "result is {\"answers\": [...]}, one per question in order, or {\"no_answer\": true, "
                     "\"reason\": ...} when nobody answered in time or nobody is there (a scheduled job): then "
                     "go on with your best judgement and say what you assumed."),
        parameters=PARAMETERS, handler=ask_user, category=Category.PERSON, idempotent=False,
        timeout_s=300.0,  # hands.ask_user.timeout_s's default; a worker lists its own setting (the Brain reads it)
    ),
]
