"""Render a conversation with a compiled chat template, as transformers does.

Any failure inside the template (its own `raise_exception`, a type error such
as concatenating a dict to a string, a sandbox violation) becomes a
`CountError`: vLLM wraps the same exceptions into an HTTP 400.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.runtime import new_context

from ._errors import CountError


@contextlib.contextmanager
def _template_errors() -> Iterator[None]:
    """A template's failure as the CountError brimful answers with (vLLM answers 400 for each)."""
    try:
        yield
    except SecurityError as exc:
        raise CountError(f"The chat template tried an operation its sandbox forbids: {exc}") from exc
    except jinja2.TemplateError as exc:
        raise CountError(f"The chat template refused the conversation: {exc}") from exc
    except RecursionError as exc:
        raise CountError("The chat template recursed too deeply while rendering.") from exc
    except Exception as exc:  # the template's own errors: TypeError, KeyError, ...
        raise CountError(f"The chat template failed while rendering: {exc}") from exc


def render(
    template: jinja2.Template,
    variables: dict[str, Any],
    *,
    continue_final_message: bool,
) -> str:
    """Render; with `continue_final_message`, cut right after the final message's content."""
    if continue_final_message:
        return _render_continued(template, variables)
    with _template_errors():
        return _render(template, variables)


def rendered_length(
    template: jinja2.Template,
    variables: dict[str, Any],
    *,
    continue_final_message: bool,
    cap: int,
) -> int:
    """The rendered text's length, or a length above `cap` as soon as the render passes it.

    For vLLM's character bound: a conversation of 10^6 empty messages rendered
    28 MB of text (+261 MiB, 43 s on a loaded 2-core machine) only to be refused
    for its length; here the template's output is measured as it is produced and
    the render stops once past `cap`, so time and memory follow the bound, not
    the body.  Errors as `render`'s.
    """
    if continue_final_message:          # the cut needs the whole text (rare, and short of the bound)
        return len(render(template, variables, continue_final_message=True))
    with _template_errors():
        return _measure(template, variables, cap)


def _measure(template: jinja2.Template, variables: dict[str, Any], cap: int) -> int:
    total = 0
    for chunk in template.root_render_func(new_render_context(template, variables)):
        total += len(chunk)
        if total > cap:
            break
    return total


_GLOBALS: weakref.WeakKeyDictionary[jinja2.Template, dict[str, Any]] = weakref.WeakKeyDictionary()


def _render(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """`template.render(**variables)`, minus a per-call cost that is not rendering.

    `Template.render` merges the template's globals (a ChainMap over the
    environment's) into a new dict on every call; iterating that ChainMap was
    ~5 % of a small request's CPU.  Here the globals are flattened once per
    template and the context is built as `render` builds it: the same parent
    mapping (variables override globals), so the same output and exceptions.
    """
    return template.environment.concat(template.root_render_func(new_render_context(template, variables)))


def new_render_context(template: jinja2.Template, variables: dict[str, Any]) -> Any:
    """`template.new_context(variables, shared=True)`, given the flattened globals: the context keeps
    the set of their names, the same from either, and building it by iterating the ChainMap was ~10 %
    of rendering a one-message chat.  Variables override globals, as in `Template.render`."""
    base = _GLOBALS.get(template)
    if base is None:
        base = _GLOBALS[template] = dict(template.globals)
    return new_context(template.environment, template.name, template.blocks, {**base, **variables}, True, base)


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _render_continued(template: jinja2.Template, variables: dict[str, Any]) -> str:
    """transformers 5.19's rule (`render_jinja_template`, vLLM 0.32's): a marker appended to the
    final message's text (a list's last part with a text), the chat rendered, and the text cut
    where the marker's last occurrence starts, trailing spaces dropped if the template ate the
    marker's own."""
    messages = variables["messages"]
    final_message = messages[-1]
    content = final_message.get("content")
    if content is None:
        raise CountError('continue_final_message is set but the final message has no "content" to continue!',
                         param="continue_final_message")
    if isinstance(content, (list, tuple)):
        blocks = [dict(block) if isinstance(block, dict) else block for block in content]
        for block in reversed(blocks):
            if isinstance(block, dict) and "text" in block:
                final = block["text"]
                block["text"] = _with_tag(final)
                break
        else:
            raise CountError(
                "continue_final_message is set but we could not find any text to continue in the final message!",
                param="continue_final_message")
        marked: Any = blocks
    else:
        final, marked = content, _with_tag(content)
    with _template_errors():
        rendered = _render(template, {**variables, "messages": [*messages[:-1], {**final_message, "content": marked}]})
    if not isinstance(final, str) or final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise CountError(
            "continue_final_message is set but the final message does not appear in the chat after "
            "applying the chat template! This can happen if the chat template deletes portions of the "
            "final message. Please verify the chat template and final message in your chat to ensure "
            "they are compatible.",
            param="continue_final_message",
        )
    at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()


def _with_tag(text: Any) -> str:
    if not isinstance(text, str):       # transformers' concatenation fails: vLLM's 400
        raise CountError("continue_final_message is set but the final message's text is not a string.",
                         param="continue_final_message")
    return text + _CONTINUE_TAG
