// openai for Node and the Vercel AI SDK's default OpenAI provider on OpenAI's Responses API,
// against a chatgate (run by tests/system/test_responses_clients.py):
// `node responses_node.mjs BASE_URL MODEL API_KEY [MAX_OUTPUT_TOKENS]` prints what each call
// gave back, as JSON.
import OpenAI from "openai";
import { generateText, streamText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";

const [baseURL, model, apiKey, maxTokens] = process.argv.slice(2);
const input = "Hello from Node";
const limit = maxTokens ? { max_output_tokens: Number(maxTokens) } : {};

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const created = await client.responses.create({ model, input, ...limit });

const stream = client.responses.stream({ model, input, ...limit });
const events = [];
let deltas = "";
for await (const event of stream) {
  events.push({ type: event.type, sequence_number: event.sequence_number });
  if (event.type === "response.output_text.delta") deltas += event.delta;
}
const final = await stream.finalResponse();

function response(r) {
  return { id: r.id, object: r.object, status: r.status, output_text: r.output_text, output: r.output, usage: r.usage };
}

// createOpenAI(...)(model) is the Responses API in @ai-sdk/openai 3
const languageModel = createOpenAI({ baseURL, apiKey })(model);
const options = { model: languageModel, prompt: input, maxRetries: 0, ...(maxTokens ? { maxOutputTokens: Number(maxTokens) } : {}) };
const generated = await generateText(options);
const streamed = streamText(options);
const pieces = [];
for await (const piece of streamed.textStream) pieces.push(piece);

console.log(JSON.stringify({
  openai: {
    create: response(created),
    stream: { events, deltas, final: response(final) },
  },
  aiSdk: {
    generateText: { text: generated.text, usage: generated.usage, finishReason: generated.finishReason },
    streamText: { text: pieces.join(""), pieces: pieces.length, usage: await streamed.usage, finishReason: await streamed.finishReason },
  },
}));
