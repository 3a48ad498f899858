"""Recipes: the output presets a job may ask for (built in, plus the studio's file)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StationDep
from api.schemas import ErrorOut, RecipeList, RecipeOut
from services.export.recipes import catalogue

router = APIRouter(prefix="/v1/recipes", tags=["recipes"])


@router.get("", response_model=RecipeList, responses={401: {"model": ErrorOut}, 422: {"model": ErrorOut}},
            summary="List the output recipes")
def list_recipes(station: StationDep) -> RecipeList:
    """422 while the studio's file is broken, though jobs go on with the recipes as last read (docs/RECIPES.md)."""
    return RecipeList(recipes=[RecipeOut(**r.to_public()) for r in catalogue(strict=True).values()])
