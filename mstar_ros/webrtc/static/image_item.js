// A picked image as a conversation item: scaled down and re-encoded as JPEG here, so that the event fits one
// data-channel message (aiortc announces 256 KB).

export const IMAGE_SIDE = 640;         // at most this wide or high
export const MAX_IMAGE_CHARS = 250000; // its data: URL, with room for the event around it

/** The image's data: URL, scaled to IMAGE_SIDE and at a JPEG quality that fits one message. */
export async function imageDataUrl(file) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, IMAGE_SIDE / Math.max(bitmap.width, bitmap.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round(bitmap.width * scale));
  canvas.height = Math.max(1, Math.round(bitmap.height * scale));
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  let url = canvas.toDataURL("image/jpeg", 0.85);
  for (let quality = 0.7; url.length > MAX_IMAGE_CHARS && quality > 0.2; quality -= 0.15)
    url = canvas.toDataURL("image/jpeg", quality);  // a detailed picture: less quality, one message still
  if (url.length > MAX_IMAGE_CHARS) throw new Error("the image does not fit one message even at low quality");
  return url;
}

export function imageItem(url) {
  return { type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_image", image_url: url }] } };
}
