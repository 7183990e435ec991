async def handle(args, ctx):
    return "ok"
