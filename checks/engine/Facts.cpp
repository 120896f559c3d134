//===- Facts.cpp - What one unit tells the whole program ------------------===//

#include "Facts.h"

namespace ulplint {

static thread_local UnitFacts *Current = nullptr;

UnitFacts *currentFacts() { return Current; }

FactScope::FactScope(UnitFacts *Sink) : Saved(Current) { Current = Sink; }
FactScope::~FactScope() { Current = Saved; }

} // namespace ulplint
