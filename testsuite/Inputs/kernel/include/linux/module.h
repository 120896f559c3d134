/*
 * Stand-in for <linux/module.h> and <linux/moduleparam.h> (Linux 6.12). The
 * macros keep the real names and arguments; their expansions are reduced to
 * declarations that reference the parameter so it is not unused.
 */
#ifndef _LINUX_MODULE_H
#define _LINUX_MODULE_H
#include <linux/types.h>

#define __init
#define __exit

#define __MODULE_CAT2(a, b) a##b
#define __MODULE_CAT(a, b) __MODULE_CAT2(a, b)
#define __MODULE_UNIQUE(prefix) __MODULE_CAT(prefix, __LINE__)

#define MODULE_LICENSE(_license) \
	static const char __MODULE_UNIQUE(__mod_license)[] \
		__attribute__((unused)) = "license=" _license
#define MODULE_DESCRIPTION(_description) \
	static const char __MODULE_UNIQUE(__mod_description)[] \
		__attribute__((unused)) = "description=" _description
#define MODULE_PARM_DESC(_parm, desc) \
	static const char __mod_parm_desc_##_parm[] \
		__attribute__((unused)) = #_parm ":" desc
#define module_param(name, type, perm) \
	static void *__param_##name __attribute__((unused)) = &(name)
#define module_param_named(name, value, type, perm) \
	static void *__param_##name __attribute__((unused)) = &(value)

#define module_init(initfn) \
	static int (*__initcall_##initfn)(void) __attribute__((unused)) = initfn
#define module_exit(exitfn) \
	static void (*__exitcall_##exitfn)(void) __attribute__((unused)) = exitfn

#endif /* _LINUX_MODULE_H */
