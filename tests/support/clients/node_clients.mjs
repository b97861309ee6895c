// openai for Node and the Vercel AI SDK against a chatgate (run by tests/system/test_clients_today.py):
// `node node_clients.mjs BASE_URL MODEL` prints what each call gave back, as JSON.
import OpenAI from "openai";
import { generateText, streamText } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { createOpenAI } from "@ai-sdk/openai";

const [baseURL, model] = process.argv.slice(2);
const prompt = "Hello from Node";

const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const created = await client.chat.completions.create({ model, messages: [{ role: "user", content: prompt }] });
let streamedText = "";
let streamedUsage = null;
const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: prompt }], stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  streamedText += chunk.choices[0]?.delta?.content ?? "";
  if (chunk.usage) streamedUsage = chunk.usage;
}

async function aiSdk(languageModel) {
  const generated = await generateText({ model: languageModel, prompt, maxRetries: 0 });
  const streamed = streamText({ model: languageModel, prompt, maxRetries: 0 });
  let text = "";
  for await (const piece of streamed.textStream) text += piece;
  return {
    generateText: { text: generated.text, usage: generated.usage },
    streamText: { text, usage: await streamed.usage },
  };
}

const compatible = createOpenAICompatible({ name: "chatgate", baseURL, apiKey: "unused", includeUsage: true });
const openai = createOpenAI({ baseURL, apiKey: "unused" });
console.log(JSON.stringify({
  openai: {
    create: { content: created.choices[0].message.content, usage: created.usage },
    stream: { content: streamedText, usage: streamedUsage },
  },
  openaiCompatible: await aiSdk(compatible(model)),
  openaiChat: await aiSdk(openai.chat(model)),
}));
