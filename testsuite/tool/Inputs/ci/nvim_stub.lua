-- Runs the Neovim snippets of docs/editors.md against a stub of the `vim`
-- API (Debian 12's Neovim is 0.7, too old for them) and prints what they
-- ask Neovim to do: which buffers reach ulplint-clangd, with which command
-- and root. Usage: lua5.4 nvim_stub.lua SNIPPET.lua
local events = {}
local log = {}
vim = {
  api = {
    nvim_create_autocmd = function(event, opts)
      events[#events + 1] = { event = event, opts = opts }
    end,
  },
  fs = {
    root = function(buf, markers)
      return '/project', table.concat(markers, ',')
    end,
  },
  lsp = {
    configs = {},
    start = function(config, opts)
      log[#log + 1] = string.format('start %s cmd=%s root=%s bufnr=%s', config.name,
        table.concat(config.cmd, ' '), config.root_dir, opts and opts.bufnr or 'current')
    end,
    config = function(name, config)
      vim.lsp.configs[name] = config
    end,
    enable = function(name)
      local c = vim.lsp.configs[name]
      log[#log + 1] = string.format('enable %s cmd=%s filetypes=%s markers=%s', name,
        table.concat(c.cmd, ' '), table.concat(c.filetypes, ','), table.concat(c.root_markers, ','))
    end,
  },
}
dofile(arg[1])
-- Opening three buffers: two C files and a C++ file.
for buf, ft in ipairs({ 'c', 'c', 'cpp' }) do
  for _, e in ipairs(events) do
    local match = false
    for _, p in ipairs(e.opts.pattern) do match = match or p == ft end
    if e.event == 'FileType' and match then
      e.opts.callback({ buf = buf, match = ft })
    end
  end
end
for _, line in ipairs(log) do print(line) end
