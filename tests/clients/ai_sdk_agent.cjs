// An AI SDK agent loop (generateText with a tool and stopWhen) over @ai-sdk/openai-compatible,
// the way opencode-style agents drive an OpenAI-compatible server: /v1/chat/completions.
// Usage: node ai_sdk_agent.cjs NPM_DIR BASE_URL MODEL MAX_OUTPUT_TOKENS [TRIM]
// Prints one JSON line: {steps, toolCalls, text, finishReason} or {error, statusCode, code}.
const { createRequire } = require("module");
const [npmDir, baseURL, model, maxOutput, trim] = process.argv.slice(2);
const load = createRequire(npmDir.replace(/\/?$/, "/"));
const { generateText, tool, stepCountIs } = load("ai");
const { createOpenAICompatible } = load("@ai-sdk/openai-compatible");
const { z } = load("zod");

const seq = Array.from({ length: 600 }, (_, i) => String(i + 1)).join("\n");
let toolCalls = 0;

async function main() {
  const provider = createOpenAICompatible({
    name: "brimful", baseURL, apiKey: "dummy", headers: trim ? { "x-brimful-trim": trim } : {},
  });
  try {
    const result = await generateText({
      model: provider(model),
      system: "You run shell commands.",
      prompt: "Count to six hundred with the shell tool, several times.",
      tools: {
        shell: tool({
          description: "Run a shell command",
          inputSchema: z.object({ cmd: z.string() }),
          execute: async () => { toolCalls += 1; return seq; },
        }),
      },
      stopWhen: stepCountIs(20),
      maxOutputTokens: Number(maxOutput),
      maxRetries: 0,
    });
    console.log(JSON.stringify({ steps: result.steps.length, toolCalls, text: result.text,
                                 finishReason: result.finishReason }));
  } catch (error) {
    let code = null;
    try { code = JSON.parse(error.responseBody).error.code; } catch (_) { /* not JSON */ }
    console.log(JSON.stringify({ error: error.name, statusCode: error.statusCode ?? null, code, toolCalls,
                                 message: String(error.message).slice(0, 300) }));
  }
}

main();
