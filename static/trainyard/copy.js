// Copy buttons for a secret shown once (templates/account/): <button data-copy="ID"> copies the
// value of the input with that id. Where the browser allows no clipboard access (a page not on
// https or localhost), the text is left selected for Ctrl-C.
for (const button of document.querySelectorAll("button[data-copy]")) {
  const field = document.getElementById(button.dataset.copy);
  if (!field) continue;
  field.addEventListener("focus", () => field.select());
  button.addEventListener("click", async () => {
    field.select();
    try {
      await navigator.clipboard.writeText(field.value);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Press Ctrl-C to copy";
    }
  });
}
