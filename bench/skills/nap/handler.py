import asyncio


async def handle(args, ctx):
    await asyncio.sleep(args["s"])
    return "rested"
