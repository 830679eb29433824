"""Guarded tools: Pipecat function handlers run under ``call.run_tool`` (SPEC section 3).

``tool.started`` is committed before the handler runs, every call has a timeout, a call id that
already has a result is not run again, and a call of an interrupted generation that has not started
yet is never started (pipecat-ai#4997).

Two ways in, one behaviour:

* :func:`guard` — ``guard(llm, call)`` once, then Pipecat's own ``llm.register_function(name,
  handler)`` registers guarded handlers (a drop-in: nothing else in the app changes). A tool that was
  registered on the LLM *before* ``guard`` would run unguarded, so ``guard`` refuses to proceed
  (:class:`~calltape.errors.CalltapeError` naming the tools) rather than leave it silently unguarded.
* :func:`register_function` — ``register_function(llm, call, name, handler)``, one tool at a time.

Under :func:`guard`, direct functions run guarded too, whichever way Pipecat registers them: listed
in the context's tools (Pipecat registers those itself, not through ``llm.register_function``),
configured on the service, or passed to ``llm.register_direct_function``.

Either way the guarded LLM's live context is reconciled before each inference (:mod:`.live`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypedDict, Unpack

from pipecat.frames.frames import FunctionCallResultProperties
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.llm_service import FunctionCallParams, LLMService

from calltape.adapters.pipecat._percall import PipecatCall, consume, jsonable
from calltape.adapters.pipecat.live import fix_before_inference
from calltape.errors import CalltapeError
from calltape.runtime import LiveCall, ToolOutcome, ToolSpec

Handler = Callable[[FunctionCallParams], Awaitable[None]]

_GUARD_ATTR = "_calltape_guard"
"""Set on a guarded LLM service: the :class:`~._percall.PipecatCall` whose tools it runs."""

log = logging.getLogger("calltape.adapters.pipecat")


def guard(llm: LLMService, call: LiveCall, *, specs: Mapping[str, ToolSpec] | None = None) -> LLMService:
    """Puts every tool of ``llm`` under calltape: from now on ``llm.register_function(name, handler,
    ...)`` registers a guarded handler (``spec=`` is accepted there too; else ``specs[name]``, then
    ``call.tools[name]``, then the defaults).

    Raises :class:`~calltape.errors.CalltapeError` when tools were registered on ``llm`` before (they
    would run unguarded) or when ``llm`` is already guarded for another call. Returns ``llm``."""
    percall = PipecatCall.of(call)
    owner = getattr(llm, _GUARD_ATTR, None)
    if owner is not None:
        if owner is percall:
            return llm
        raise CalltapeError("this Pipecat LLM service is already guarded for another call")
    plain = unguarded_tools(llm)
    if plain:
        raise CalltapeError(
            "tools registered before calltape.adapters.pipecat.guard() would run unguarded: "
            + ", ".join(sorted(plain))
            + "; call guard(llm, call) first, then llm.register_function(...)"
        )
    original = llm.register_function
    known = dict(specs or {})

    def register_function(
        function_name: str | None, handler: Any, *, spec: ToolSpec | None = None, **kwargs: Any
    ) -> None:
        if function_name is None:
            raise CalltapeError("a catch-all handler (function_name=None) cannot be guarded; register each tool")
        _register(original, call, function_name, handler, spec=spec or known.get(function_name), **kwargs)

    direct: dict[str, Any] = {}
    """Direct functions registered guarded, by name: the function each name runs."""

    def register_direct_function(
        function: Any,
        *,
        cancel_on_interruption: bool | None = None,
        timeout_secs: float | None = None,
        cancellable_by_llm: bool | None = None,
    ) -> None:
        name = str(getattr(function, "__name__", ""))
        register_function(
            name,
            direct_handler(function),
            timeout_secs=timeout_secs,
            cancel_on_interruption=cancel_on_interruption,
            cancellable_by_llm=cancellable_by_llm,
        )
        direct[name] = function

    warned: set[str] = set()

    def guard_registry(tools: Any) -> None:
        """Direct functions reach the guard whichever way Pipecat registers them: the ones the
        context lists are registered guarded before Pipecat's own auto-registration sees them
        (it leaves an explicit registration alone), and the ones it already registered on its
        own (a service's configured tools) are registered again, guarded."""
        listed = _direct_functions(tools)
        service_tools = getattr(llm, "_service_tools", None)
        if not listed and callable(service_tools):  # a service configured with tools of its own
            listed = _direct_functions(service_tools())
        for wrapper in listed:
            if direct.get(wrapper.name) is wrapper.function:
                continue  # already guarded
            if wrapper.name not in direct and _is_guarded(llm, wrapper.name):
                continue  # registered with llm.register_function: an explicit registration wins
            register_direct_function(wrapper.function)
        registry = getattr(llm, "_functions", None)
        if not isinstance(registry, Mapping):
            return
        for name, item in list(registry.items()):
            handler = getattr(item, "handler", None)
            if name is None or getattr(handler, "_calltape_guarded", False):
                continue
            if getattr(handler, "__self__", None) is llm:
                continue  # Pipecat's own built-in tools (the cancel tools of cancellable ones)
            function = getattr(handler, "function", None)
            if callable(function):  # Pipecat's wrapper of a direct function
                register_direct_function(function)
            elif name not in warned:
                warned.add(name)
                log.error(
                    "calltape: the tool %r runs unguarded (Pipecat registered it without "
                    "llm.register_function); register it with llm.register_function after guard()",
                    name,
                )

    llm.register_function = register_function  # type: ignore[method-assign]
    llm.register_direct_function = register_direct_function  # type: ignore[method-assign,assignment]
    setattr(llm, _GUARD_ATTR, percall)
    percall.llms.append(llm)
    fix_before_inference(llm, percall, tools_hook=guard_registry)
    return llm


def direct_handler(function: Callable[..., Awaitable[Any]]) -> Handler:
    """A Pipecat direct function (``async def tool(params, **arguments)``) as a classic handler
    (``async def handler(params)``), keeping its ``@tool_options`` and its name."""

    async def handler(params: FunctionCallParams) -> None:
        await function(params=params, **dict(params.arguments or {}))

    for attr in ("_pipecat_cancel_on_interruption", "_pipecat_timeout_secs", "_pipecat_cancellable_by_llm"):
        if hasattr(function, attr):
            setattr(handler, attr, getattr(function, attr))
    handler.__name__ = getattr(function, "__name__", handler.__name__)
    handler.__doc__ = function.__doc__
    return handler


def _direct_functions(tools: Any) -> list[Any]:
    """The direct functions of a Pipecat tool set (``ToolsSchema.direct_functions``), if any."""
    if isinstance(tools, list | tuple):
        tools = LLMContext(tools=list(tools)).tools if tools else None
    found = getattr(tools, "direct_functions", None)
    return list(found) if isinstance(found, list | tuple) else []


def _is_guarded(llm: LLMService, name: str) -> bool:
    registry = getattr(llm, "_functions", None)
    item = registry.get(name) if isinstance(registry, Mapping) else None
    return bool(getattr(getattr(item, "handler", None), "_calltape_guarded", False))


def unguarded_tools(llm: LLMService) -> set[str]:
    """Tools registered on ``llm`` that run unguarded.

    The adapter's one read of a Pipecat private: Pipecat 1.10 to 1.14 offer ``has_function(name)``
    (true for every name once a catch-all is registered) but no list of what is registered, and the
    loud error for a tool registered before :func:`guard` needs the names. A Pipecat without the
    registry yields no names, so the check is skipped rather than failing the call."""
    registry = getattr(llm, "_functions", None)
    if not isinstance(registry, Mapping):
        return set()
    if getattr(llm, _GUARD_ATTR, None) is not None:
        return {
            str(name) if name is not None else "<catch-all>"
            for name, item in registry.items()
            if not getattr(getattr(item, "handler", None), "_calltape_guarded", False)
        }
    return {str(name) if name is not None else "<catch-all>" for name in registry}


class RegisterOptions(TypedDict, total=False):
    """The keyword options of a guarded registration (:func:`register_function`, and
    ``llm.register_function`` once :func:`guard` ran): calltape's ``spec``, and Pipecat's own options."""

    spec: ToolSpec | None
    timeout_secs: float | None
    cancel_on_interruption: bool | None
    cancellable_by_llm: bool | None


def register_function(
    llm: LLMService, call: LiveCall, function_name: str, handler: Handler, **options: Unpack[RegisterOptions]
) -> None:
    """Registers one guarded tool: ``llm.register_function(name, handler)`` with ``handler`` run under
    calltape (see :func:`guard` for the drop-in form).

    The handler keeps its Pipecat signature (``async def handler(params)`` and ``await
    params.result_callback(result)``). ``spec`` (a :class:`~calltape.runtime.ToolSpec`) sets the
    timeout (``timeout_secs`` overrides it), the interruption policy, idempotency and reuse; the
    timeout is calltape's, so Pipecat's own ``timeout_secs`` is left unset. With
    ``on_interrupt="finish"`` (the default) a call Pipecat cancels on a barge-in keeps running and its
    result lands in calltape's context and in Pipecat's live context; with ``"cancel"`` the
    cancellation reaches the handler.
    """
    register = llm.register_function
    if getattr(llm, _GUARD_ATTR, None) is None:
        fix_before_inference(llm, PipecatCall.of(call))
    _register(register, call, function_name, handler, **options)


def _register(
    register: Callable[..., Any],
    call: LiveCall,
    function_name: str,
    handler: Any,
    *,
    spec: ToolSpec | None = None,
    timeout_secs: float | None = None,
    cancel_on_interruption: bool | None = None,
    cancellable_by_llm: bool | None = None,
    **kwargs: Any,
) -> None:
    if getattr(handler, "_calltape_guarded", False):
        guarded = handler
    else:
        state = PipecatCall.of(call)
        state.guarded_names.add(function_name)
        tool_spec = spec or call.tools.get(function_name) or ToolSpec()
        if timeout_secs is not None:
            tool_spec = dataclasses.replace(tool_spec, timeout=timeout_secs)
        guarded = GuardedFunction(call, state, function_name, handler, tool_spec)
    register(
        function_name,
        guarded,
        cancel_on_interruption=cancel_on_interruption,
        cancellable_by_llm=cancellable_by_llm,
        **kwargs,
    )


class GuardedFunction:
    """The Pipecat handler that wraps the user's handler in ``call.run_tool``."""

    _calltape_guarded = True

    # How long to wait for the observer to announce a call before recording it without its reply.
    ANNOUNCE_WAIT = 0.5

    def __init__(self, call: LiveCall, state: PipecatCall, name: str, handler: Handler, spec: ToolSpec) -> None:
        self.call = call
        self.percall = state
        self.name = name
        self.handler = handler
        self.spec = spec
        self.__name__ = getattr(handler, "__name__", name)
        self.__doc__ = handler.__doc__
        # Pipecat's @tool_options decorations stay visible to register_function.
        for attr in ("_pipecat_cancel_on_interruption", "_pipecat_timeout_secs", "_pipecat_cancellable_by_llm"):
            if hasattr(handler, attr):
                setattr(self, attr, getattr(handler, attr))

    async def __call__(self, params: FunctionCallParams) -> None:
        """Runs one call under ``call.run_tool`` and reports its one outcome to Pipecat."""
        call_id = params.tool_call_id
        reply = await self._announced(params)
        self.percall.guard_entered.add(call_id)
        arguments = jsonable(dict(params.arguments or {}))
        body = self._body(params)
        inner = asyncio.ensure_future(
            self.call.run_tool(call_id, self.name, arguments, body, reply=reply, spec=self.spec)
        )
        try:
            outcome: ToolOutcome = await asyncio.shield(inner)
        except asyncio.CancelledError:
            # Pipecat gave up on the call (barge-in with cancel_on_interruption, teardown). calltape's
            # ToolSpec decides what happens to the tool: "cancel" stops it when the interruption is
            # recorded, "finish" lets it run; either way it ends under its timeout, in the log, and
            # its one output is written back into Pipecat's live context (.live).
            self.percall.abandoned.add(call_id)
            self.percall.background.add(inner)
            context = getattr(params, "context", None)
            inner.add_done_callback(self._landed(context))
            raise
        properties = None
        if not outcome.ran and outcome.status == "cancelled":
            # A call of an interrupted generation: settle it in Pipecat's context without a new inference.
            properties = FunctionCallResultProperties(run_llm=False)
        with contextlib.suppress(Exception):
            await params.result_callback(outcome.output, properties=properties)

    def _landed(self, context: Any) -> Callable[[asyncio.Future[Any]], None]:
        def done(task: asyncio.Future[Any]) -> None:
            self.percall.background.discard(task)
            consume(task)
            if context is not None:
                with contextlib.suppress(Exception):
                    self.percall.reconcile(context)

        return done

    async def _announced(self, params: FunctionCallParams) -> str | None:
        """The reply that asked for this call, once the observer has recorded ``tool.call``."""
        call_id = params.tool_call_id
        if call_id not in self.percall.call_reply and self.percall.observed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ANNOUNCE_WAIT):  # (wait_for on 3.11 can lose a cancellation)
                    await self.percall.seen(call_id).wait()
        # Let the observer take in what was pushed before this call ran (an interruption, say).
        await asyncio.sleep(0)
        # Unannounced (no observer): run_tool records tool.call itself, without a reply.
        self.percall.call_seen.pop(call_id, None)
        return self.percall.call_reply.get(call_id)

    def _body(self, params: FunctionCallParams) -> Callable[[Any], Awaitable[Any]]:
        handler = self.handler

        async def body(progress: Callable[..., Any]) -> Any:
            landed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            async def result_callback(result: Any, *, properties: FunctionCallResultProperties | None = None) -> None:
                if properties is not None and not properties.is_final:
                    done = progress(jsonable(result))
                    if inspect.isawaitable(done):
                        await done
                    return
                if not landed.done():
                    landed.set_result(result)

            own = dataclasses.replace(params, result_callback=result_callback)
            task = asyncio.ensure_future(handler(own))
            try:
                await asyncio.wait({task, landed}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                task.cancel()  # calltape's timeout or an interruption with on_interrupt="cancel"
                raise
            try:
                if not landed.done():
                    task.result()  # raises the handler's exception, if any
                    return None  # returned without a result: Pipecat would say "COMPLETED"
                return jsonable(landed.result())
            finally:
                if not task.done():
                    # Pipecat handlers may go on after reporting (cleanup, fillers); let them.
                    task.add_done_callback(consume)
                if task.done() and not task.cancelled():
                    consume(task)

        return body
