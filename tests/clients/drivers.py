"""The real SDKs, used as apps use them, against any OpenAI-compatible base URL.

Each scenario drives one SDK the way its documentation shows (tools with
`strict`, structured outputs, agents with handoffs, completions…) against
`base` (a URL without /v1).  Paired with the scripted upstream of
tests/clients/recorder.py (`SCRIPTS`), the conversations go the same way every
run: a tool is called once, its result sent back, then the model answers, so
the recorded request bodies include a tool round trip.

Used twice: tests/clients/capture.py records the bodies for the corpus, and
tests/e2e/test_clients.py runs the same scenarios through brimful.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.clients.script import Script

MODEL = "tiny-qwen"
API_KEY = "sk-test"

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of litellm's price list


@dataclass(frozen=True)
class Scenario:
    name: str
    distribution: str  # the PyPI name whose version is recorded
    run: Callable[[str], None]
    script: Script
    # "main": the project's test venv (openai 3.x); "openai2": the SDKs whose
    # current releases still require openai < 3 (tests/clients/envs.py).
    env: str = "main"

    def client(self) -> str:
        """"<distribution> <version>" as installed where this runs."""
        return f"{self.distribution} {importlib.metadata.version(self.distribution)}"


WEATHER_ARGS = {"city": "Paris"}
PERSON_JSON = json.dumps({"name": "Ada Lovelace", "age": 36, "languages": ["English", "français"]})


# ---------------------------------------------------------------------------
# openai
# ---------------------------------------------------------------------------

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def _openai(base: str):
    import openai

    return openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


def openai_chat_tools_strict(base: str) -> None:
    """Chat with a strict tool, one tool round trip, answers in the loop."""
    client = _openai(base)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather assistant. Answer in one sentence."},
        {"role": "user", "content": "What's the weather in Paris? Réponds en français."},
    ]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=64)
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": json.dumps({"temp_c": 18, "sky": "clear"})})
    client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=64)


def openai_pydantic_function_tool(base: str) -> None:
    """`openai.pydantic_function_tool` (docstring → description) with `chat.completions.parse`."""
    import openai
    from pydantic import BaseModel, Field

    class GetWeather(BaseModel):
        """Look up the current weather for a city."""

        city: str = Field(description="City name")
        unit: str = Field(default="celsius", description="celsius or fahrenheit")

    client = _openai(base)
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris, please."}]
    first = client.chat.completions.parse(model=MODEL, messages=messages, tools=tools, max_completion_tokens=64)
    message = first.choices[0].message
    messages.append({"role": "assistant", "content": message.content,
                     "tool_calls": [c.model_dump(exclude={"function": {"parsed_arguments"}})
                                    for c in message.tool_calls or []]})
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "18°C, clear"})
    client.chat.completions.parse(model=MODEL, messages=messages, tools=tools, max_completion_tokens=64)


def openai_structured_output(base: str) -> None:
    """`chat.completions.parse(response_format=Model)`: a strict json_schema response format."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        languages: list[str]

    client = _openai(base)
    client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "system", "content": "Extract the person."},
                  {"role": "user", "content": "Ada Lovelace, 36, wrote in English and français."}],
        response_format=Person,
        max_tokens=128,
    )


def openai_stream_parts(base: str) -> None:
    """Streamed chat with usage, content as text parts, emoji and CJK."""
    client = _openai(base)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                           {"type": "text", "text": "简体中文 OK."}]},
            {"role": "user", "content": [{"type": "text", "text": "안녕하세요 👋 — summarise: "},
                                         {"type": "text", "text": "東京は日本の首都です。"}]},
        ],
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.2,
        max_tokens=32,
    )
    for _ in stream:
        pass


def openai_completions(base: str) -> None:
    """The legacy completions endpoint, one prompt and a batch."""
    client = _openai(base)
    client.completions.create(model=MODEL, prompt="def fibonacci(n):\n    \"\"\"Return the n-th number.\"\"\"\n",
                              max_tokens=32, stop=["\n\n"])
    client.completions.create(model=MODEL, prompt=["Translate to German: cheese =>", "Übersetze: Käse =>"],
                              max_tokens=8)


def openai_responses(base: str) -> None:
    """The Responses API with instructions and a function tool (stored for /v1/responses)."""
    client = _openai(base)
    tool = {"type": "function", "name": "get_weather", "description": "Current weather for a city.",
            "parameters": WEATHER_TOOL["function"]["parameters"], "strict": True}
    first = client.responses.create(model=MODEL, instructions="You are a weather assistant.",
                                    input="Weather in Paris?", tools=[tool], max_output_tokens=64)
    items: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    for item in first.output:
        if item.type == "function_call":
            items.append({"type": "function_call", "call_id": item.call_id, "name": item.name,
                          "arguments": item.arguments})
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": "18°C"})
    client.responses.create(model=MODEL, instructions="You are a weather assistant.", input=items, tools=[tool],
                            max_output_tokens=64)


# ---------------------------------------------------------------------------
# openai-agents
# ---------------------------------------------------------------------------

def _agents(responses_api: bool):
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city.

        Args:
            city: The city to look up.
        """
        return f"18°C and clear in {city}"

    def model(client: AsyncOpenAI):
        if responses_api:
            return OpenAIResponsesModel(model=MODEL, openai_client=client)
        return OpenAIChatCompletionsModel(model=MODEL, openai_client=client)

    def build(base: str):
        client = AsyncOpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        spanish = Agent(name="Spanish agent", instructions="You only speak Spanish.", model=model(client))
        return Agent(
            name="Assistant",
            instructions="You are a helpful assistant. Use tools when useful.",
            tools=[get_weather],
            handoffs=[spanish],
            model=model(client),
        )

    return build


def _run_agent(agent, text: str) -> None:
    from agents import Runner

    async def main() -> None:
        await Runner.run(agent, text, max_turns=4)

    asyncio.run(main())


def agents_chat_tools(base: str) -> None:
    """Agent + OpenAIChatCompletionsModel: a function tool round trip (handoff tool offered)."""
    _run_agent(_agents(False)(base), "What's the weather in Paris?")


def agents_chat_handoff(base: str) -> None:
    """Agent + OpenAIChatCompletionsModel: the model hands off to the Spanish agent."""
    _run_agent(_agents(False)(base), "Hola, ¿puedes hablar español?")


def agents_responses_tools(base: str) -> None:
    """Agent + OpenAIResponsesModel: the same tool round trip over /v1/responses."""
    _run_agent(_agents(True)(base), "What's the weather in Paris?")


# ---------------------------------------------------------------------------
# langchain-openai
# ---------------------------------------------------------------------------

def _chat_openai(base: str, **kwargs: Any):
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    return ChatOpenAI(model=MODEL, base_url=base + "/v1", api_key=SecretStr(API_KEY), max_retries=0, timeout=300,
                      **kwargs)


def langchain_bind_tools(base: str) -> None:
    """ChatOpenAI.bind_tools with a @tool, then the ToolMessage round trip."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return f"18°C in {city}"

    llm = _chat_openai(base, max_tokens=64).bind_tools([get_weather])
    messages: list[Any] = [SystemMessage("You are a weather bot."), HumanMessage("Weather in Paris?")]
    first = llm.invoke(messages)
    messages.append(first)
    for call in first.tool_calls:
        messages.append(ToolMessage(content=get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    llm.invoke(messages)


def langchain_structured_output(base: str) -> None:
    """with_structured_output: the default (json_schema) and function_calling methods."""
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person mentioned in the text."""

        name: str = Field(description="Full name")
        age: int
        languages: list[str]

    text = "Ada Lovelace, 36, wrote in English and français."
    _chat_openai(base).with_structured_output(Person).invoke(text)
    _chat_openai(base).with_structured_output(Person, method="function_calling").invoke(text)


def langchain_completions(base: str) -> None:
    """The completions LLM `langchain_openai.OpenAI`."""
    from langchain_openai import OpenAI
    from pydantic import SecretStr

    llm = OpenAI(model=MODEL, base_url=base + "/v1", api_key=SecretStr(API_KEY), max_retries=0, max_tokens=16,
                 timeout=300)
    llm.invoke("Q: What is the capital of France?\nA:")


# ---------------------------------------------------------------------------
# llama-index
# ---------------------------------------------------------------------------

def llamaindex_openailike_tools(base: str) -> None:
    """OpenAILike as a function-calling chat model: chat_with_tools, then the tool result."""
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return f"18°C in {city}"

    tool = FunctionTool.from_defaults(fn=get_weather)
    llm = OpenAILike(model=MODEL, api_base=base + "/v1", api_key=API_KEY, is_chat_model=True,
                     is_function_calling_model=True, context_window=2048, max_tokens=64, max_retries=0, timeout=300)
    system = ChatMessage(role="system", content="You answer weather questions.")
    question = ChatMessage(role="user", content="Weather in Paris?")
    response = llm.chat_with_tools([tool], user_msg=question, chat_history=[system])
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
    messages = [system, question, response.message]
    for call in calls:
        messages.append(ChatMessage(role="tool", content=tool(**call.tool_kwargs).content,
                                    additional_kwargs={"tool_call_id": call.tool_id, "name": call.tool_name}))
    llm.chat(messages)


# ---------------------------------------------------------------------------
# litellm
# ---------------------------------------------------------------------------

def _litellm_round_trip(base: str, model: str) -> None:
    import litellm

    messages: list[Any] = [{"role": "system", "content": "You are a weather assistant."},
                           {"role": "user", "content": "Weather in Paris?"}]
    kwargs = {"model": model, "api_base": base + "/v1", "api_key": API_KEY, "tools": [WEATHER_TOOL],
              "max_tokens": 64, "num_retries": 0, "timeout": 300}
    first = litellm.completion(messages=messages, **kwargs)
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "18°C"})
    litellm.completion(messages=messages, **kwargs)


def litellm_hosted_vllm(base: str) -> None:
    """litellm's `hosted_vllm/` provider with a strict tool and a round trip."""
    _litellm_round_trip(base, f"hosted_vllm/{MODEL}")


def litellm_openai(base: str) -> None:
    """litellm's `openai/` provider (an OpenAI-compatible base URL) with the same conversation."""
    _litellm_round_trip(base, f"openai/{MODEL}")


# ---------------------------------------------------------------------------
# instructor
# ---------------------------------------------------------------------------

def _instructor(base: str, mode_name: str) -> None:
    import instructor
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        languages: list[str]

    client = instructor.from_openai(_openai(base), mode=getattr(instructor.Mode, mode_name))
    client.chat.completions.create(
        model=MODEL,
        response_model=Person,
        max_retries=0,
        max_tokens=128,
        messages=[{"role": "user", "content": "Ada Lovelace, 36, wrote in English and français."}],
    )


def instructor_json(base: str) -> None:
    """instructor Mode.JSON: the schema goes into the system message."""
    _instructor(base, "JSON")


def instructor_tools(base: str) -> None:
    """instructor Mode.TOOLS: the model as a forced tool call."""
    _instructor(base, "TOOLS")


# ---------------------------------------------------------------------------
# An Aider/Continue-style coding conversation (written by hand, sent with openai)
# ---------------------------------------------------------------------------

CODE = '''import json
from dataclasses import dataclass, field


@dataclass
class Cart:
    items: dict[str, int] = field(default_factory=dict)

    def add(self, sku: str, qty: int = 1) -> None:
        if qty <= 0:
            raise ValueError(f"qty must be positive, got {qty}")
        self.items[sku] = self.items.get(sku, 0) + qty

    def total(self, prices: dict[str, float]) -> float:
        return sum(prices[sku] * qty for sku, qty in self.items.items())

    def to_json(self) -> str:
        return json.dumps({"items": self.items}, sort_keys=True)
'''

AIDER_SYSTEM = (
    "Act as an expert software developer.\nAlways use best practices when coding.\n"
    "Respect and use existing conventions, libraries, etc that are already present in the code base.\n"
    "Take requests for changes to the supplied code.\n\n"
    "Once you understand the request you MUST:\n"
    "1. Decide if you need to propose *SEARCH/REPLACE* edits to any files that haven't been added to the chat.\n"
    "2. Think step-by-step and explain the needed changes in a few short sentences.\n"
    "3. Describe each change with a *SEARCH/REPLACE block* per the examples below.\n\n"
    "Every *SEARCH/REPLACE block* must use this format:\n"
    "1. The *FULL* file path alone on a line, verbatim.\n2. The opening fence and code language, eg: ```python\n"
    "3. The start of search block: <<<<<<< SEARCH\n"
    "4. A contiguous chunk of lines to search for in the existing source code\n"
    "5. The dividing line: =======\n6. The lines to replace into the source code\n"
    "7. The end of the replace block: >>>>>>> REPLACE\n"
    "8. The closing fence: ```\n"
)


def aider_style_conversation(base: str) -> None:
    """A long multi-turn coding chat: repo map, file contents, SEARCH/REPLACE edits, a tab and CRLF."""
    client = _openai(base)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": AIDER_SYSTEM},
        {"role": "user", "content": "Here are summaries of some files present in my git repository.\n\n"
                                    "shop/cart.py:\n│class Cart:\n│    def add(self, sku, qty)\n"
                                    "│    def total(self, prices)\n"
                                    "shop/prices.py:\n│PRICES = {...}\n│def load_prices(path)\n"},
        {"role": "assistant", "content": "Ok, I won't try and edit those files without asking first."},
        {"role": "user", "content": "I have *added these files to the chat* so you can go ahead and edit them.\n\n"
                                    f"shop/cart.py\n```python\n{CODE}```\n"},
        {"role": "assistant", "content": "Ok, any changes I propose will be to those files."},
        {"role": "user", "content": "Add a remove(sku, qty) method that never lets a quantity go below zero,\r\n"
                                    "and make total() round to 2 decimals.\tKeep the style."},
        {"role": "assistant", "content": "I'll add `remove` and round the total.\n\n"
                                         "shop/cart.py\n```python\n<<<<<<< SEARCH\n"
                                         "    def total(self, prices: dict[str, float]) -> float:\n"
                                         "        return sum(prices[sku] * qty for sku, qty in self.items.items())\n"
                                         "=======\n"
                                         "    def remove(self, sku: str, qty: int = 1) -> None:\n"
                                         "        left = self.items.get(sku, 0) - qty\n        if left > 0:\n"
                                         "            self.items[sku] = left\n        else:\n"
                                         "            self.items.pop(sku, None)\n\n"
                                         "    def total(self, prices: dict[str, float]) -> float:\n"
                                         "        return round(sum(prices[sku] * qty for sku, qty in "
                                         "self.items.items()), 2)\n"
                                         ">>>>>>> REPLACE\n```\n"},
        {"role": "user", "content": "I committed the changes with git hash 3f2a9c1 & commit msg: "
                                    "feat: add Cart.remove and round totals\n\n"
                                    "Now write pytest tests for remove(), including the edge case "
                                    "qty > current quantity. "
                                    "Les noms de tests en anglais, s'il vous plaît. 🙏"},
    ]
    client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=256, stream=True)


SCENARIOS: list[Scenario] = [
    Scenario("openai_chat_tools_strict", "openai", openai_chat_tools_strict,
             Script(tool_calls={"get_weather": WEATHER_ARGS})),
    Scenario("openai_pydantic_function_tool", "openai", openai_pydantic_function_tool,
             Script(tool_calls={"GetWeather": {"city": "Paris", "unit": "celsius"}})),
    Scenario("openai_structured_output", "openai", openai_structured_output, Script(json_content=PERSON_JSON)),
    Scenario("openai_stream_parts", "openai", openai_stream_parts, Script()),
    Scenario("openai_completions", "openai", openai_completions, Script(text=" return n")),
    Scenario("openai_responses", "openai", openai_responses, Script(tool_calls={"get_weather": WEATHER_ARGS})),
    Scenario("agents_chat_tools", "openai-agents", agents_chat_tools, Script(tool_calls={"get_weather": WEATHER_ARGS})),
    Scenario("agents_chat_handoff", "openai-agents", agents_chat_handoff,
             Script(tool_calls={"transfer_to_spanish_agent": {}}, text="¡Claro que sí!")),
    Scenario("agents_responses_tools", "openai-agents", agents_responses_tools,
             Script(tool_calls={"get_weather": WEATHER_ARGS})),
    Scenario("langchain_bind_tools", "langchain-openai", langchain_bind_tools,
             Script(tool_calls={"get_weather": WEATHER_ARGS})),
    Scenario("langchain_structured_output", "langchain-openai", langchain_structured_output,
             Script(tool_calls={"Person": json.loads(PERSON_JSON)}, json_content=PERSON_JSON)),
    Scenario("langchain_completions", "langchain-openai", langchain_completions, Script(text=" Paris")),
    Scenario("llamaindex_openailike_tools", "llama-index-llms-openai-like", llamaindex_openailike_tools,
             Script(tool_calls={"get_weather": WEATHER_ARGS}), env="openai2"),
    Scenario("litellm_hosted_vllm", "litellm", litellm_hosted_vllm, Script(tool_calls={"get_weather": WEATHER_ARGS})),
    Scenario("litellm_openai", "litellm", litellm_openai, Script(tool_calls={"get_weather": WEATHER_ARGS})),
    Scenario("instructor_json", "instructor", instructor_json, Script(json_content=PERSON_JSON, text=PERSON_JSON),
             env="openai2"),
    Scenario("instructor_tools", "instructor", instructor_tools,
             Script(tool_calls={"Person": json.loads(PERSON_JSON)}), env="openai2"),
    Scenario("aider_style_conversation", "openai", aider_style_conversation, Script(text="Here are the tests.")),
]

BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}
